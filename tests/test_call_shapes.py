"""Property: whatever the call shape and whichever arguments callbacks replace, the
method receives exactly what a reference model says (both implementations, fast
and general paths alike)."""

from __future__ import annotations

import inspect

from hypothesis import given, settings
from hypothesis import strategies as st

NAMES = ("a", "b", "c")


def _reference(args, kwargs, replacements):
    """Bind like Python, apply each callback's replacements in order."""

    def f(self, a, b=2, *rest, c=3, **kw):
        pass

    bound = inspect.signature(f).bind(None, *args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    for names, tag in replacements:
        for name in names:
            values[name] = values[name] * 10 + tag
    return values["a"], values["b"], values["rest"], values["c"], values["kw"]


calls = st.tuples(
    st.integers(min_value=1, max_value=4),  # positional arguments after self
    st.booleans(),  # pass b by keyword (when not positional)
    st.booleans(),  # pass c
    st.booleans(),  # pass an extra keyword
)
callbacks = st.lists(
    st.tuples(st.sets(st.sampled_from(NAMES), min_size=1), st.integers(min_value=1, max_value=9)),
    max_size=3,
)


@settings(max_examples=120, deadline=None)
@given(call=calls, replacements=callbacks, repeat=st.integers(min_value=1, max_value=3))
def test_replacements_reach_the_method_as_the_model_says(hw_module, call, replacements, repeat):
    hw = hw_module
    received = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, a, b=2, *rest, c=3, **kw):
            received.append((a, b, rest, c, kw))

    t = Trainer()
    order = []
    for names, tag in replacements:
        ordered = tuple(n for n in NAMES if n in names)
        order.append((ordered, tag))
        params = ", ".join(ordered)
        source = f"def cb(self, {params}):\n    return " + (
            f"{ordered[0]} * 10 + {tag}" if len(ordered) == 1
            else "(" + ", ".join(f"{n} * 10 + {tag}" for n in ordered) + ")"
        )
        namespace: dict = {}
        exec(source, namespace)
        t.before("step", namespace["cb"])
    seen_after = []
    t.after("step", lambda self, a, b, c: seen_after.append((a, b, c)))
    n_pos, b_by_keyword, pass_c, extra = call
    args = tuple(range(1, n_pos + 1))
    kwargs = {}
    if n_pos == 1 and b_by_keyword:
        kwargs["b"] = 5
    if pass_c:
        kwargs["c"] = 7
    if extra:
        kwargs["z"] = 9
    expected = _reference(args, kwargs, order)
    for _ in range(repeat):  # repeated calls take the cached plans
        received.clear()
        seen_after.clear()
        t.step(*args, **kwargs)
        assert received == [expected]
        # post callbacks read the final arguments, defaults included
        assert seen_after == [(expected[0], expected[1], expected[3])]
