"""Property: whatever the call shape and whichever arguments callbacks replace, the
method receives exactly what a reference model says (both implementations, fast
and general paths alike)."""

from __future__ import annotations

import inspect

import pytest
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


def _outcome(call):
    try:
        return ("returned", call())
    except TypeError as exc:
        return ("raised", str(exc))


# (args, kwargs) after the object; several are calls Python refuses.
SHAPES = [((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3), {}), ((1, 2, 3, 4), {}),
          ((), {"a": 1}), ((1,), {"b": 2}), ((), {"a": 1, "b": 2, "c": 3}), ((1,), {"a": 1}),
          ((1,), {"z": 0}), ((1, 2), {"c": 3})]


def _signatures():
    """Join point bodies: required arguments (one, none, more than the pure twin's
    slots), defaults, keyword-only, positional-only, *args and **kwargs."""
    return {
        "a": "def step(self, a): return (a,)",
        "a, b=2": "def step(self, a, b=2): return (a, b)",
        "a, /, b, *, c=3": "def step(self, a, /, b, *, c=3): return (a, b, c)",
        "*rest, **kw": "def step(self, *rest, **kw): return (rest, kw)",
        "no arguments": "def step(self): return ()",
        "nine": "def step(self, a, b, c, d, e, f, g, h, i): return (a, i)",
    }


def test_a_join_point_accepts_the_calls_its_function_does_and_advice_sees_each_as_made(hw):
    """Whichever twin, nothing registered or around advice: the call returns what
    the bare function returns, or raises its TypeError with the same message; the
    advice gets the arguments as the caller passed them (positional or keyword)."""
    for label, source in _signatures().items():
        namespace: dict = {}
        exec(source, namespace)
        bare = namespace["step"]

        class Trainer(hw.Hookable):
            step = hw.hookable(bare)

        Trainer.step.__qualname__ = bare.__qualname__  # TypeErrors name it alike

        plain, advised = Trainer(), Trainer()
        seen = []

        def advice(self, proceed, *args, **kwargs):
            seen.append((args, kwargs))
            return proceed(*args, **kwargs)

        advised.around("step", advice)
        shapes = SHAPES + [((1,) * 9, {}), ((1,) * 8, {"i": 9})]
        for args, kwargs in shapes:
            for repeat in range(2):  # the first call plans, the second takes the plan
                expected = _outcome(lambda: bare(plain, *args, **kwargs))
                assert _outcome(lambda: plain.step(*args, **kwargs)) == expected, (label, args, kwargs)
                seen.clear()
                assert _outcome(lambda: advised.step(*args, **kwargs)) == expected, (label, args, kwargs)
                assert seen == [(args, kwargs)], (label, args, kwargs)


def test_proceed_takes_its_arguments_by_position_or_keyword(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, a, b=2):
            return (a, b)

    t = Trainer()
    calls = iter([lambda p: p(1), lambda p: p(a=1), lambda p: p(1, 5), lambda p: p(1, b=5),
                  lambda p: p()])
    t.around("step", lambda self, proceed, *args, **kwargs: next(calls)(proceed))
    assert [t.step(0) for _ in range(4)] == [(1, 2), (1, 2), (1, 5), (1, 5)]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'a'"):
        t.step(0)


def test_filtered_around_advice_sees_keyword_calls_as_made(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch, scale=1):
            return batch * scale

    t, seen = Trainer(), []

    def advice(self, proceed, *args, **kwargs):
        seen.append((args, kwargs))
        return proceed(*args, **kwargs)

    t.around("step", advice, every=2)
    assert [t.step(1, scale=3) for _ in range(3)] + [t.step(batch=2) for _ in range(2)] == [3, 3, 3, 2, 2]
    assert seen == [((1,), {"scale": 3}), ((), {"batch": 2})]  # every second call: the 2nd and the 4th
