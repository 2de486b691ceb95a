"""docs/design/contract.md §4: around advice and error advice."""

from __future__ import annotations

import asyncio
import re

import pytest


def make(hw, log):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch, scale=1):
            log.append(("step", batch, scale))
            if batch == "bad":
                raise ValueError("bad batch")
            return batch * scale

    return Trainer


def test_around_wraps_the_call_and_can_change_args_and_result(hw):
    log = []
    t = make(hw, log)()

    def timing(self, proceed, *args, **kwargs):
        log.append(("enter", args, kwargs))
        result = proceed(args[0] + 1, **kwargs)
        log.append(("exit", result))
        return result * 10

    t.around("step", timing)
    assert t.step(1, scale=2) == 40
    assert log == [("enter", (1,), {"scale": 2}), ("step", 2, 2), ("exit", 4)]


def test_around_nesting_order_and_pre_post_outside(hw):
    log = []
    t = make(hw, log)()

    def outer(self, proceed, *args, **kwargs):
        log.append("outer in")
        r = proceed(*args, **kwargs)
        log.append("outer out")
        return r

    def inner(self, proceed, *args, **kwargs):
        log.append("inner in")
        r = proceed(*args, **kwargs)
        log.append("inner out")
        return r

    t.before("step", lambda self: log.append("pre"))
    t.after("step", lambda self: log.append("post"))
    t.around("step", outer)
    t.around("step", inner)
    t.step(1)
    assert log == ["pre", "outer in", "inner in", ("step", 1, 1), "inner out", "outer out", "post"]


def test_around_may_skip_the_call(hw):
    log = []
    t = make(hw, log)()
    t.around("step", lambda self, proceed, *a, **k: "cached")
    assert t.step(1) == "cached"
    assert log == []


def test_around_calling_proceed_twice_is_an_error(hw):
    t = make(hw, [])()

    def twice(self, proceed, *args, **kwargs):
        proceed(*args, **kwargs)
        return proceed(*args, **kwargs)

    t.around("step", twice)
    with pytest.raises(hw.HookError, match=r"around callback .*twice .*called proceed\(\) a second time"):
        t.step(1)


def test_around_signature_is_checked(hw):
    t = make(hw, [])()
    with pytest.raises(hw.CallbackSignatureError, match=r"around advice is called as fn\(self, proceed, \*args"):
        t.around("step", lambda self: None)


def test_around_error_inside_the_method_gets_no_note_but_its_own_does(hw):
    t = make(hw, [])()
    t.around("step", lambda self, proceed, *a, **k: proceed(*a, **k))
    with pytest.raises(ValueError) as info:
        t.step("bad")
    assert not getattr(info.value, "__notes__", [])

    def broken(self, proceed, *a, **k):
        raise RuntimeError("in advice")

    t2 = make(hw, [])()
    t2.around("step", broken)
    with pytest.raises(RuntimeError) as info2:
        t2.step(1)
    assert "around-step" in info2.value.__notes__[0] and "broken" in info2.value.__notes__[0]


def test_nested_around_advice_notes_only_the_advice_whose_error_it_is(hw):
    def passing(self, proceed, *a, **k):
        return proceed(*a, **k)

    def failing(self, proceed, *a, **k):
        raise RuntimeError("in advice")

    def translating(self, proceed, *a, **k):
        try:
            return proceed(*a, **k)
        except ValueError as exc:
            raise KeyError("translated") from exc

    t = make(hw, [])()
    t.around("step", passing)
    t.around("step", failing)
    with pytest.raises(RuntimeError) as info:
        t.step(1)
    assert len(info.value.__notes__) == 1 and "failing" in info.value.__notes__[0]

    t = make(hw, [])()
    t.around("step", passing)
    t.around("step", passing)
    with pytest.raises(ValueError) as info:
        t.step("bad")  # the method's own error, through both: no note
    assert not getattr(info.value, "__notes__", [])

    t = make(hw, [])()
    t.around("step", passing)
    t.around("step", translating)
    with pytest.raises(KeyError) as info:
        t.step("bad")
    assert len(info.value.__notes__) == 1 and "translating" in info.value.__notes__[0]
    assert not getattr(info.value.__cause__, "__notes__", [])


def test_error_callbacks_observe_and_the_exception_propagates(hw):
    seen = []
    t = make(hw, [])()
    t.on_error("step", lambda self, exception, batch: seen.append((type(exception).__name__, batch)))
    with pytest.raises(ValueError, match="bad batch"):
        t.step("bad")
    assert seen == [("ValueError", "bad")]
    assert t.step(2) == 2
    assert seen == [("ValueError", "bad")]


def test_error_callbacks_fire_for_errors_in_callbacks_too(hw):
    seen = []
    t = make(hw, [])()

    def explode(self, batch):
        raise KeyError(batch)

    t.before("step", explode)
    t.on_error("step", lambda self, exception: seen.append(repr(exception)))
    with pytest.raises(KeyError):
        t.step(1)
    assert seen == ["KeyError(1)"]


def test_error_raised_by_an_error_callback_chains_the_original(hw):
    t = make(hw, [])()

    def fail(self, exception):
        raise RuntimeError("while handling")

    t.on_error("step", fail)
    with pytest.raises(RuntimeError, match="while handling") as info:
        t.step("bad")
    assert isinstance(info.value.__context__, ValueError)


def test_error_callback_must_return_none(hw):
    t = make(hw, [])()
    t.on_error("step", lambda self, exception: "recovered")
    with pytest.raises(hw.CallbackReturnError, match=r"error callbacks observe.*use around advice"):
        t.step("bad")


def test_exception_name_is_for_error_callbacks_only(hw):
    t = make(hw, [])()
    with pytest.raises(hw.CallbackSignatureError, match=r"asks for 'exception'.*error callbacks only"):
        t.before("step", lambda self, exception: None)


def test_around_and_error_as_class_methods(hw):
    log = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, x):
            if x < 0:
                raise ValueError(x)
            return x

        def around_step_callback(self, proceed, x):
            return proceed(x) + 1

        def error_step_callback(self, exception):
            log.append(str(exception))

    t = Trainer()
    assert t.step(1) == 2
    with pytest.raises(ValueError):
        t.step(-1)
    assert log == ["-1"]


def test_async_around_and_error(hw):
    log = []

    class Trainer(hw.Hookable):
        @hw.hookable
        async def step(self, x):
            if x < 0:
                raise ValueError(x)
            return x

    async def around(self, proceed, x):
        return (await proceed(x)) * 2

    async def on_error(self, exception):
        log.append(str(exception))

    t = Trainer()
    t.around("step", around)
    t.on_error("step", on_error)
    assert asyncio.run(t.step(3)) == 6
    with pytest.raises(ValueError):
        asyncio.run(t.step(-1))
    assert log == ["-1"]


def test_around_sees_what_pre_callbacks_replaced_and_filters_skip_advice(hw):
    """Around advice between pre and post callbacks, positional or keyword calls,
    a filtered advice skipped on the calls it does not admit, on methods,
    classmethods and plain functions; a call with more keywords than the
    compiled path's fixed array reaches the function whole."""
    log = []
    t = make(hw, log)()
    t.before("step", lambda self, batch: batch + 1)
    t.around("step", lambda self, proceed, batch, **kw: proceed(batch * 10, **kw) + 0.5, every=2)
    t.after("step", lambda self, return_value: return_value + 1000)
    assert t.step(1) == 1002  # advice filtered out: (1 + 1) * 1 + 1000
    assert t.step(1, scale=3) == 1060.5  # (1 + 1) * 10 * 3 + 0.5 + 1000
    assert t.step(batch=2) == 1003
    assert [entry[1:] for entry in log] == [(2, 1), (20, 3), (3, 1)]

    class Loop(hw.Hookable):
        @hw.hookable
        @classmethod
        def scale(cls, x):
            return (cls.__name__, x)

        @hw.hookable
        def wide(self, **kw):
            return len(kw), kw.get("k39")

    @hw.hookable
    def shift(x, by=1):
        return x - by

    hw.around(Loop, "scale", lambda cls, proceed, x: proceed(x * 2))
    shift.around(lambda proceed, x, **kw: proceed(x, **kw) * 100)
    assert Loop.scale(3) == ("Loop", 6)
    assert shift(5) == 400 and shift(5, by=2) == 300
    loop = Loop()
    loop.around("wide", lambda self, proceed, **kw: proceed(**kw, extra=1))
    many = {f"k{i}": i for i in range(40)}
    assert loop.wide(**many) == (41, 39)


def test_each_call_gets_its_own_proceed_and_none_keeps_the_call_alive(hw):
    """A proceed the advice keeps stays that call's (a second call is an error,
    and later calls get others); one it does not keep holds nothing of its call:
    the object is freed with its last reference."""
    import gc
    import weakref

    kept = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            return batch + 1

    def keeping(self, proceed, batch):
        if batch < 0:
            kept.append(proceed)
        return proceed(abs(batch))

    hw.around(Trainer, "step", keeping)
    t = Trainer()
    assert [t.step(-1), t.step(2), t.step(-3), t.step(4)] == [2, 3, 4, 5]
    assert len(kept) == 2 and kept[0] is not kept[1]
    with pytest.raises(hw.HookError, match=r"called proceed\(\) a second time"):
        kept[0](1)
    kept.clear()
    gone = weakref.ref(t)
    gc.disable()  # freed by its reference count, not by a collection
    try:
        del t
        assert gone() is None
    finally:
        gc.enable()


def test_around_advice_may_call_its_join_point_again(hw):
    class Tree(hw.Hookable):
        @hw.hookable
        def depth(self, n):
            return 0 if n == 0 else 1 + self.depth(n - 1)

    seen = []

    def counting(self, proceed, n):
        seen.append(n)
        return proceed(n) * 10 if n == 0 else proceed(n)

    hw.around(Tree, "depth", counting)
    assert Tree().depth(3) == 3 and seen == [3, 2, 1, 0]
    seen.clear()
    assert Tree().depth(1) == 1 and seen == [1, 0]  # the inner call's result is 0 * 10


def test_innermost_proceed_passes_arguments_as_given_to_a_function(hw):
    @hw.hookable
    def shift(x, by=1):
        return x - by

    calls = iter([lambda p: p(5), lambda p: p(5, by=2), lambda p: p(x=5, by=3), lambda p: p()])
    shift.around(lambda proceed, x, by=1: next(calls)(proceed))
    assert [shift(0) for _ in range(3)] == [4, 3, 2]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        shift(0)


# --- audit items 6 and 15: advice and callbacks that could only fail at a call -------------


def _loop(hw):
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self, batch, /, scale=1, *, keep=False):
            return batch * scale

    return Loop


@pytest.mark.parametrize("advice, message", [
    (lambda self, proceed: proceed(), r"argument 'batch' cannot be passed to the advice"),
    (lambda self, proceed, **k: proceed(**k), r"argument 'batch' cannot be passed to the advice"),
    (lambda self, proceed, batch, scale=1: proceed(batch, scale), r"argument 'keep' cannot be passed"),
    (lambda proceed: proceed(), r"around advice is called as fn\(self, proceed, \*args, \*\*kwargs\)"),
])
def test_around_advice_that_cannot_take_the_arguments_is_refused(hw, advice, message):
    with pytest.raises(hw.CallbackSignatureError, match=message):
        _loop(hw)().around("step", advice)


def test_around_advice_naming_the_arguments_is_accepted(hw):
    loop = _loop(hw)()
    loop.around("step", lambda self, proceed, batch, scale=1, keep=False: proceed(batch, scale * 2, keep=keep))
    assert loop.step(3) == 6


def test_async_and_generator_callbacks_on_a_sync_join_point_are_refused(hw):
    loop = _loop(hw)()

    async def pre(self, batch):
        return batch

    def gen(self, batch):
        yield batch

    async def advice(self, proceed, *args, **kwargs):
        return proceed(*args, **kwargs)

    for fn, verb in ((pre, loop.before), (gen, loop.before), (advice, loop.around)):
        with pytest.raises(hw.CallbackSignatureError, match="async def or generator function, but the join point is not async"):
            verb("step", fn)
    with pytest.raises(hw.HookError, match="when=.* is an async def"):
        async def ready(obj):
            return True

        loop.before("step", lambda self: None, when=ready)


def test_generator_callbacks_on_an_async_join_point_are_refused(hw):
    # An async join point awaits a callback's coroutine, but a generator function's
    # (or async generator function's) call makes a generator, which replaced the
    # argument it was given, unrun.
    class Loop(hw.Hookable):
        @hw.hookable
        async def step(self, batch):
            return batch

        @hw.hookable
        async def stream(self, n):
            yield n

    loop = Loop()

    def gen(self, batch):
        yield batch

    async def agen(self, batch):
        yield batch

    def gen_advice(self, proceed, *args, **kwargs):
        yield proceed(*args, **kwargs)

    async def agen_advice(self, proceed, *args, **kwargs):
        yield await proceed(*args, **kwargs)

    cases = [(gen, loop.before, "step"), (agen, loop.before, "step"), (agen, loop.after, "step"),
             (gen_advice, loop.around, "step"), (agen_advice, loop.around, "stream")]
    for fn, verb, event in cases:
        with pytest.raises(hw.CallbackSignatureError,
                           match=rf"callback .*{fn.__name__}.*is a.* generator function.*Make it an async def without yield"):
            verb(event, fn)
    assert asyncio.run(loop.step(3)) == 3


# Audit (issue 21) item 10: a proceed is valid only inside its own call.


@pytest.mark.parametrize("path", ["fast", "general", "nested", "filtered"])
def test_a_kept_proceed_is_refused_after_its_call_and_in_another_call(hw, path):
    """A proceed the advice did not call before returning cannot run the method
    later (that would skip the chain), neither after the call nor during the next
    one; both the planned path and the general one (an error callback, a filter)."""
    log = []
    kept = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            log.append(("step", batch))
            return batch

    def keeping(self, proceed, batch):
        if batch == "keep":
            kept.append(proceed)  # not called: the advice skips the call
            return "skipped"
        if kept:  # call 2 tries call 1's proceed
            return kept[0](batch)
        return proceed(batch)

    t = Trainer()
    if path == "nested":  # the inner advice keeps its proceed
        t.around("step", lambda self, proceed, batch: proceed(batch))
    t.around("step", keeping, every=1 if path == "filtered" else None)
    if path == "general":
        t.on_error("step", lambda self, exception: None)
    assert t.step("keep") == "skipped"
    with pytest.raises(hw.HookError, match=r"kept its proceed\(\).*after that call of join point "
                                           r"'step' had ended: proceed is only valid inside the "
                                           r"advice's own call"):
        kept[0]("late")
    with pytest.raises(hw.HookError, match=r"only valid inside the advice's own call"):
        t.step("next")  # its advice calls call 1's proceed
    assert log == []
    kept.clear()
    assert t.step(5) == 5 and log == [("step", 5)]


def test_a_proceed_kept_by_advice_that_raised_is_refused_later(hw):
    log = []
    kept = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            log.append(batch)
            return batch

    def failing(self, proceed, batch):
        kept.append(proceed)
        raise KeyError(batch)

    Trainer().around("step", failing)
    t = Trainer()
    t.around("step", failing)
    with pytest.raises(KeyError):
        t.step(1)
    with pytest.raises(hw.HookError, match=r"only valid inside the advice's own call"):
        kept[0](2)
    assert log == []


def test_async_advice_calling_proceed_without_await_is_an_error(hw):
    log = []

    class Trainer(hw.Hookable):
        @hw.hookable
        async def step(self, x):
            log.append(x)
            return x

    async def forgetful(self, proceed, x):
        proceed(x)  # never awaited: the method would not run
        return 0

    t = Trainer()
    handle = t.around("step", forgetful)
    with pytest.raises(hw.HookError, match=r"called proceed\(\) without awaiting it.*"
                                           r"`return await proceed\(\.\.\.\)`"):
        asyncio.run(t.step(1))
    assert log == []
    handle.remove()

    kept = []

    async def keeping(self, proceed, x):
        kept.append(proceed)
        return -1

    async def passing(self, proceed, x):  # returning proceed's awaitable is fine too
        return proceed(x)

    t.around("step", passing)
    assert asyncio.run(t.step(2)) == 2 and log == [2]
    t.around("step", keeping)
    assert asyncio.run(t.step(3)) == -1
    with pytest.raises(hw.HookError, match=r"only valid inside the advice's own call"):
        kept[0](4)
    assert log == [2]


def test_async_advice_errors_are_noted_unless_passed_through(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        async def step(self, x):
            raise ValueError(x)

    async def translating(self, proceed, x):
        if x == 1:
            return await proceed(x)
        raise KeyError(x)

    t = Trainer()
    t.around("step", translating)
    with pytest.raises(ValueError) as passed:
        asyncio.run(t.step(1))
    assert not getattr(passed.value, "__notes__", None)
    with pytest.raises(KeyError) as own:
        asyncio.run(t.step(2))
    assert len(own.value.__notes__) == 1
    assert re.fullmatch(r"hookwrap: raised in callback .*translating.* during event 'around-step'",
                        own.value.__notes__[0])
