"""Property-based differential test (issue 21, "Show"): random registrations (every
tier, every phase, every option), removals, calls and emits run through BOTH
dispatch twins -- the compiled ``_fast`` and the pure ``_fast_py`` -- and must give
identical results, exceptions (type, message, notes) and callback logs.

Each twin is a separately loaded ``hookwrap`` package (``load_hookwrap``); the same
scenario, a list of plain data drawn by hypothesis, is built in each from scratch.
Derandomized: every run draws the same examples, so CI reproduces a failure.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import load_hookwrap

EXAMPLES = 300


def _side_by_side(first: str, second: str) -> tuple[Any, Any]:
    """Two hookwrap packages loaded side by side (HOOKWRAP_NO_EXTENSIONS values);
    what ``sys.modules`` held is put back after, so tests on the session's ``hw``
    keep pickling by reference as before."""
    saved = {k: v for k, v in sys.modules.items() if k == "hookwrap" or k.startswith("hookwrap.")}
    loaded = load_hookwrap(first), load_hookwrap(second)
    for k in [k for k in sys.modules if k == "hookwrap" or k.startswith("hookwrap.")]:
        del sys.modules[k]
    sys.modules.update(saved)
    return loaded


@pytest.fixture(scope="module")
def twins() -> Iterator[tuple[Any, Any]]:
    """Both twins loaded side by side."""
    compiled, pure = _side_by_side("", "1")
    if not compiled.USING_EXTENSION:
        pytest.skip("hookwrap._fast is not built")
    assert not pure.USING_EXTENSION
    yield compiled, pure


TIERS = ("a", "b", "sub", "class", "subclass", "global", "function")
PHASES = ("pre", "post", "around", "error", "on")
# What a callback does, by phase (see _make_callback).
KINDS = {
    "pre": ("log", "replace_x", "replace_both", "read_scale_default", "raise", "bad_none",
            "bad_value", "bad_tuple", "bad_type"),
    "post": ("log", "read_x", "replace_result", "raise", "bad_return", "bad_none"),
    "around": ("proceed", "proceed_kw", "skip", "twice", "raise", "swallow", "star"),
    "error": ("log", "read_x", "bad_return", "raise"),
    "on": ("log", "read_value", "raise", "bad_return"),
}

options = st.fixed_dictionaries({}, optional={
    "once": st.booleans(),
    "every": st.sampled_from([None, 1, 2, 3]),
    "when": st.sampled_from(["even", "odd", "raise"]),
    "prepend": st.booleans(),
    "before": st.integers(0, 12),  # a name: cb<n>, registered or not
    "after": st.integers(0, 12),
})

registration = st.tuples(st.just("reg"), st.sampled_from(TIERS), st.sampled_from(PHASES),
                         st.integers(0, 8), options)
operation = st.one_of(
    registration,
    registration,
    st.tuples(st.just("remove"), st.integers(0, 30)),
    *[st.tuples(st.just("call"), st.sampled_from(["a", "b", "sub", "function"]),
                st.sampled_from([0, 1, 2, 13, -1]), st.sampled_from([None, 1, 3]))] * 2,
    st.tuples(st.just("emit"), st.sampled_from(["a", "b", "sub"]), st.sampled_from([0, 5]),
              st.booleans()),
    st.tuples(st.just("cbobject"), st.sampled_from(["a", "sub", "class", "global"]),
              st.booleans()),
)
scenarios = st.lists(operation, min_size=4, max_size=30)


class _Raised(Exception):
    pass


def _make_callback(n: int, phase: str, kind: str, log: list[Any]) -> Any:
    """Callback ``cb<n>`` of the given phase and kind, appending to ``log``. Built
    the same way in each twin, so labels and messages match."""
    name = f"cb{n}"
    if phase == "pre":
        if kind == "log":
            def cb(self): log.append((name, "pre"))
        elif kind == "replace_x":
            def cb(self, x):
                log.append((name, "pre", x))
                return x + n
        elif kind == "replace_both":
            def cb(self, x, scale):
                log.append((name, "pre", x, scale))
                return x + 1, scale * 2
        elif kind == "read_scale_default":
            def cb(self, scale=5):
                log.append((name, "pre-scale", scale))
                return scale
        elif kind == "raise":
            def cb(self, x):
                log.append((name, "raise"))
                raise _Raised(f"{name} raised on {x}")
        elif kind == "bad_none":
            def cb(self, x):
                log.append((name, "bad"))
        elif kind == "bad_value":
            def cb(self):
                log.append((name, "bad"))
                return 7
        elif kind == "bad_tuple":
            def cb(self, x, scale):
                log.append((name, "bad"))
                return x
        else:
            def cb(self, x):
                log.append((name, "bad"))
                return (x, x, x)
    elif phase == "post":
        if kind == "log":
            def cb(self): log.append((name, "post"))
        elif kind == "read_x":
            def cb(self, x): log.append((name, "post", x))
        elif kind == "replace_result":
            def cb(self, return_value):
                log.append((name, "post", return_value))
                return (return_value or 0) + n
        elif kind == "raise":
            def cb(self, return_value):
                log.append((name, "raise"))
                raise _Raised(f"{name} raised after {return_value}")
        elif kind == "bad_return":
            def cb(self):
                log.append((name, "bad"))
                return "oops"
        else:
            def cb(self, return_value):
                log.append((name, "bad"))
    elif phase == "around":
        if kind == "proceed":
            def cb(self, proceed, x, scale=1):
                log.append((name, "around", x, scale))
                return proceed(x + 1, scale)
        elif kind == "proceed_kw":
            def cb(self, proceed, x, scale=1):
                log.append((name, "around-kw", x))
                return proceed(x=x, scale=scale + 1)
        elif kind == "skip":
            def cb(self, proceed, *args, **kwargs):
                log.append((name, "skip", args, sorted(kwargs.items())))
                return -n
        elif kind == "twice":
            def cb(self, proceed, *args, **kwargs):
                log.append((name, "twice"))
                proceed(*args, **kwargs)
                return proceed(*args, **kwargs)
        elif kind == "raise":
            def cb(self, proceed, *args, **kwargs):
                log.append((name, "raise"))
                raise _Raised(f"{name} around raised")
        elif kind == "swallow":
            def cb(self, proceed, *args, **kwargs):
                try:
                    return proceed(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - recovery is what around is for
                    log.append((name, "swallowed", type(exc).__name__, str(exc)))
                    return "recovered"
        else:
            def cb(self, proceed, *args, **kwargs):
                log.append((name, "star", args, sorted(kwargs.items())))
                return proceed(*args, **kwargs)
    elif phase == "error":
        if kind == "log":
            def cb(self, exception):
                log.append((name, "error", type(exception).__name__, str(exception)))
        elif kind == "read_x":
            def cb(self, exception, x): log.append((name, "error", x))
        elif kind == "bad_return":
            def cb(self, exception):
                log.append((name, "bad"))
                return 1
        else:
            def cb(self, exception):
                log.append((name, "raise"))
                raise _Raised(f"{name} error callback raised")
    else:  # custom event
        if kind == "log":
            def cb(self): log.append((name, "on"))
        elif kind == "read_value":
            def cb(self, value=None): log.append((name, "on", value))
        elif kind == "raise":
            def cb(self, value=None):
                log.append((name, "raise"))
                raise _Raised(f"{name} listener raised")
        else:
            def cb(self):
                log.append((name, "bad"))
                return 3
    cb.__name__ = cb.__qualname__ = name
    return cb


def _function_callback(cb: Any) -> Any:
    """The same callback for the plain-function join point (no ``self``)."""
    def fn(*args: Any, **kwargs: Any) -> Any:
        return cb(None, *args, **kwargs)
    params = list(inspect.signature(cb).parameters.values())[1:]
    wrapper = functools.wraps(cb)(fn)
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    del wrapper.__wrapped__
    return wrapper


def _outcome(fn: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn())
    except Exception as exc:  # noqa: BLE001 - the outcome compared between twins
        return ("raised", type(exc).__name__, str(exc), tuple(getattr(exc, "__notes__", ())))


def run_scenario(hw: Any, ops: list[Any]) -> list[Any]:
    log: list[Any] = []

    class DiffTrainer(hw.Hookable):
        emits = ("on_diff",)

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        @hw.hookable
        def dstep(self, x, scale=1):
            self.calls += 1
            log.append(("body", x, scale))
            if x == 13:
                raise _Raised("unlucky 13")
            return x * scale

    class DiffSub(DiffTrainer):
        pass

    @hw.hookable("dstep")
    def dfunc(x, scale=1):
        log.append(("fbody", x, scale))
        if x == 13:
            raise _Raised("unlucky 13")
        return x * scale

    class DiffCallback(hw.Callback):
        def __init__(self, raise_in_pre: bool) -> None:
            self.raise_in_pre = raise_in_pre

        def pre_dstep(self, trainer, x):
            log.append(("cbobj", "pre", x))
            if self.raise_in_pre and x == 2:
                raise _Raised("cbobj pre raised")
            return x

        def post_dstep(self, trainer, return_value):
            log.append(("cbobj", "post", return_value))
            return return_value

    objs = {"a": DiffTrainer(), "b": DiffTrainer(), "sub": DiffSub()}
    handles: list[Any] = []
    out: list[Any] = []

    def when_of(kind: str) -> Any:
        def when(obj: Any) -> bool:
            if kind == "raise":
                raise _Raised("when raised")
            calls = getattr(obj, "calls", len(log))
            return bool(calls % 2) == (kind == "odd")
        when.__name__ = when.__qualname__ = f"when_{kind}"
        return when

    try:
        for n, op in enumerate(ops):
            before = len(log)
            if op[0] == "reg":
                _, tier, phase, k, opts = op
                kinds = KINDS[phase]
                cb = _make_callback(n, phase, kinds[k % len(kinds)], log)
                kw = {key: value for key, value in opts.items() if value is not None}
                if "when" in kw:
                    kw["when"] = when_of(kw["when"])
                for key in ("before", "after"):
                    if key in kw:
                        kw[key] = f"cb{kw[key]}"

                def register(tier: str = tier, phase: str = phase, cb: Any = cb, kw: Any = kw) -> Any:
                    verb = {"pre": hw.before, "post": hw.after, "around": hw.around,
                            "error": hw.on_error, "on": hw.on}[phase]
                    if tier == "global":
                        event = "on_diff" if phase == "on" else f"{phase}-dstep"
                        return hw.register_global_callback((event, cb), **kw)
                    if tier == "function":
                        if phase == "on":
                            return hw.on(dfunc, "on_diff", cb, **kw)
                        return verb(dfunc, "dstep" if phase != "on" else "on_diff", _function_callback(cb), **kw)
                    target = {"class": DiffTrainer, "subclass": DiffSub}.get(tier) or objs[tier]
                    return verb(target, "on_diff" if phase == "on" else "dstep", cb, **kw)

                result = _outcome(register)
                if result[0] == "ok":
                    handles.append(result[1])
                    result = ("ok", "registered")
                out.append(("reg", result))
            elif op[0] == "remove":
                if handles:
                    h = handles.pop(op[1] % len(handles))
                    out.append(("remove", _outcome(h.remove)))
            elif op[0] == "call":
                _, who, x, scale = op
                call_args = (x,) if scale is None else (x, scale)
                if who == "function":
                    out.append(("call", _outcome(lambda a=call_args: dfunc(*a))))
                else:
                    obj = objs[who]
                    out.append(("call", _outcome(lambda o=obj, a=call_args: o.dstep(*a))))
            elif op[0] == "emit":
                _, who, value, with_value = op
                obj = objs[who]
                kwargs = {"value": value} if with_value else {}
                out.append(("emit", _outcome(lambda o=obj, k=kwargs: o.emit("on_diff", **k))))
            elif op[0] == "cbobject":
                _, where, raise_in_pre = op
                cbo = DiffCallback(raise_in_pre)

                def attach(where: str = where, cbo: Any = cbo) -> Any:
                    if where == "global":
                        return hw.register_global_callback(cbo)
                    if where == "function":
                        return hw.add_callback(dfunc, cbo)
                    return hw.add_callback(DiffTrainer if where == "class" else objs["a"], cbo)

                result = _outcome(attach)
                if result[0] == "ok":
                    handles.append(result[1])
                    result = ("ok", "registered")
                out.append(("cbobject", result))
            out.append(("log", log[before:]))
    finally:
        for h in handles:
            h.remove()
    # After every removal, calls run the bare body.
    del log[:]
    out.append(("final", _outcome(lambda: objs["a"].dstep(2)), _outcome(lambda: dfunc(2)), log[:]))
    return out


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=scenarios)
def test_twins_agree_on_random_scenarios(twins: tuple[Any, Any], ops: list[Any]) -> None:
    compiled, pure = twins
    got_compiled = run_scenario(compiled, ops)
    got_pure = run_scenario(pure, ops)
    for step, (c, p) in enumerate(zip(got_compiled, got_pure)):
        assert c == p, f"twins differ at step {step} of {ops!r}:\ncompiled: {c!r}\npure:     {p!r}"
    assert len(got_compiled) == len(got_pure)
    assert got_compiled[-1][1:] == (("ok", 2), ("ok", 2), [("body", 2, 1), ("fbody", 2, 1)])


@pytest.fixture(scope="module")
def generated_and_reference() -> Iterator[tuple[Any, Any]]:
    """Two pure twins: one as shipped (calls run on code _fast_py generates from the
    plan), one whose calls all take the reference path: ``_rules``' absorb,
    call_around and emit loop, each rule written once."""
    generated, reference = _side_by_side("1", "1")
    reference._fast_py.generated_runner = lambda *args: False  # no generated runner: the general path
    reference._chains.emit_runner = lambda plan: functools.partial(reference._rules.run_emit_steps, plan)
    yield generated, reference


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=scenarios)
def test_generated_code_agrees_with_the_reference_steps(generated_and_reference: tuple[Any, Any],
                                                        ops: list[Any]) -> None:
    generated, reference = generated_and_reference
    got = run_scenario(generated, ops)
    expected = run_scenario(reference, ops)
    for step, (g, r) in enumerate(zip(got, expected)):
        assert g == r, f"generated code and reference differ at step {step} of {ops!r}:\n" \
                       f"generated: {g!r}\nreference: {r!r}"
    assert len(got) == len(expected)


def test_the_reference_twin_really_takes_the_general_path(generated_and_reference: tuple[Any, Any]) -> None:
    generated, reference = generated_and_reference
    ran = {}
    for name, hw in (("generated", generated), ("reference", reference)):
        class T(hw.Hookable):
            @hw.hookable("step")
            def step(self, x: int) -> int:
                return x

        t = T()
        t.before("step", lambda self, x: x + 1)
        assert t.step(1) == 2
        (chain,) = t.__hookwrap__.chains.values()  # the instance's own chain
        ran[name] = sum(1 for run in chain.runners.values() if run)
    assert ran == {"generated": 1, "reference": 0}
