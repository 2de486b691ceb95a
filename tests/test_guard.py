"""hookwrap.extend.guard: a join point's callbacks run inside a guard, and a call
with none to run never reaches it (what makes a preset's stage cost the dispatch
alone where nobody listens)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest


def _woven(hw: Any) -> tuple[type, list[Any]]:
    extend = importlib.import_module("hookwrap.extend")
    guarded: list[Any] = []

    class Loop:
        def step(self, batch: int, scale: int = 1) -> int:
            return batch * scale

    extend.weave_only(Loop, "step")

    def guard(run: Any, func: Any, obj: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        guarded.append((obj, list(args), dict(kwargs)))
        try:
            return run(lambda *a, **k: func(*a, **k) + 1000)  # in place of the function
        except hw.StopTraining:
            return -1

    extend.guard(vars(Loop)["step"], guard)
    return Loop, guarded


def test_the_guard_runs_only_when_callbacks_do(hw: Any) -> None:
    Loop, guarded = _woven(hw)
    loop, other = Loop(), Loop()
    assert loop.step(2) == 2 and guarded == []  # nothing to run: the function alone
    hw.before(loop, "step", lambda self, batch: batch + 1)
    seen: list[int] = []
    hw.after(loop, "step", lambda self, return_value: seen.append(return_value) or return_value)
    assert loop.step(2, scale=3) == 1009  # pre changed batch, the guard's function ran, post saw it
    assert seen == [1009] and guarded == [(loop, [loop, 2], {"scale": 3})]
    assert other.step(2) == 2 and len(guarded) == 1  # another instance, no callbacks


def test_the_guard_sees_a_callbacks_stop_and_error_callbacks_run(hw: Any) -> None:
    Loop, guarded = _woven(hw)
    loop = Loop()
    errors: list[str] = []

    def stop(self: Any) -> None:
        raise hw.StopTraining("enough")

    hw.before(loop, "step", stop)
    hw.on_error(loop, "step", lambda self, exception: errors.append(type(exception).__name__))
    assert loop.step(1) == -1 and errors == []  # a StopTraining is no failure


def test_around_advice_runs_inside_the_guard(hw: Any) -> None:
    Loop, guarded = _woven(hw)
    loop = Loop()

    def twice(self: Any, proceed: Any, batch: int, scale: int = 1) -> int:
        return proceed(batch, scale) * 2

    hw.around(loop, "step", twice)
    assert loop.step(3) == 2006 and len(guarded) == 1


def test_guard_refuses_what_cannot_take_one(hw: Any) -> None:
    extend = importlib.import_module("hookwrap.extend")

    class Loop:
        def step(self) -> None:
            pass

        def batches(self) -> Any:
            yield 1

    extend.weave_only(Loop, "step", "batches")
    with pytest.raises(hw.HookError, match="is not a join point"):
        extend.guard(lambda: None, lambda *a: None)
    with pytest.raises(hw.HookError, match="coroutine or generator"):
        extend.guard(vars(Loop)["batches"], lambda *a: None)
    with pytest.raises(hw.HookError, match="must be callable"):
        extend.guard(vars(Loop)["step"], 3)
    extend.guard(vars(Loop)["step"], lambda run, func, obj, args, kwargs: run(func))
    with pytest.raises(hw.HookError, match="has a guard already"):
        extend.guard(vars(Loop)["step"], lambda *a: None)


def test_a_preset_stage_is_its_join_point_where_nothing_notes_it_runs(hw: Any) -> None:
    # A stage nobody listens to costs the dispatch alone: the class holds the join
    # point itself, with no Python wrapper around it; a run (fit) or a tracked
    # stage keeps a wrapper that notes it runs.
    weaving = importlib.import_module("hookwrap.integrations._weaving")
    extend = importlib.import_module("hookwrap.extend")

    class Trainer:
        def fit(self) -> int:
            return self.step(1)

        def step(self, batch: int) -> int:
            return batch

    handle = weaving.PresetHandle("test")
    weaving.stage(handle, Trainer, "fit", "fit", fit=True)
    weaving.stage(handle, Trainer, "step", "step", stop=weaving.stop_while_running(lambda owner: None))
    assert type(vars(Trainer)["step"]).__name__ in ("JoinPoint", "function")
    assert extend.is_join_point(vars(Trainer)["step"]) and not extend.is_join_point(vars(Trainer)["fit"])
    trainer = Trainer()

    def stop(self: Any, return_value: int) -> int:
        raise hw.StopTraining("done")

    hw.after(trainer, "step", stop)
    assert trainer.fit() == 1  # stopped after the step ran: the run goes on with its result
    assert isinstance(handle.stopped, hw.StopTraining)
    with pytest.raises(hw.StopTraining):
        trainer.step(2)  # outside a run there is nothing to stop: it propagates
    handle.remove()
    assert trainer.fit() == 1 and not extend.is_join_point(vars(Trainer)["step"])


def test_listened_says_whether_a_call_would_run_callbacks(hw: Any) -> None:
    extend = importlib.import_module("hookwrap.extend")

    class Loop:
        def step(self, batch: int) -> int:
            return batch

    extend.weave_only(Loop, "step")
    listened = extend.listened(vars(Loop)["step"])
    one, two = Loop(), Loop()
    assert not listened(one) and not listened(two)
    handle = hw.before(one, "step", lambda self, batch: batch)
    assert listened(one) and not listened(two)  # the instance tier: that object only
    handle.remove()
    assert not listened(one)
    hw.before(Loop, "step", lambda self, batch: batch)
    assert listened(one) and listened(two)  # the class tier: every instance
    with pytest.raises(hw.HookError, match="not a method join point"):
        extend.listened(lambda: None)


def test_a_routed_call_nobody_listens_to_reaches_the_method_alone(hw: Any) -> None:
    weaving = importlib.import_module("hookwrap.integrations._weaving")
    calls: list[str] = []

    class Engine:
        def backward(self, loss: float) -> float:
            calls.append("backward")
            return loss * 2

    class Loop:
        def __init__(self) -> None:
            self.engine = Engine()
            self.engine.loop = self  # type: ignore[attr-defined]

    handle = weaving.PresetHandle("routed")
    weaving.routed(handle, Loop, "backward", Engine, "backward", lambda engine: getattr(engine, "loop", None))
    loop = Loop()
    hooked = vars(Loop)["hookwrap_backward"]
    assert loop.engine.backward(1.0) == 2.0 and calls == ["backward"]
    seen: list[float] = []
    hw.after(loop, "backward", lambda self, loss, return_value: seen.append(return_value) or return_value)
    assert loop.engine.backward(3.0) == 6.0 and seen == [6.0] and calls == ["backward"] * 2
    assert extend_listened(hooked)(loop)
    handle.remove()


def extend_listened(value: Any) -> Any:
    return importlib.import_module("hookwrap.extend").listened(value)
