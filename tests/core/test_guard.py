"""hookwrap.extend.guard: a join point's callbacks run inside a guard, and a call
with none to run never reaches it (what makes a preset's stage cost the dispatch
alone where nobody listens)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest


def _woven(hw: Any) -> tuple[type, list[Any]]:
    extend = importlib.import_module("hookwrap.extend")
    stops: list[Any] = []

    class Loop:
        def step(self, batch: int, scale: int = 1) -> int:
            return batch * scale

    extend.weave_only(Loop, "step")

    def stopped(obj: Any, exc: Any, ran: int, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        stops.append((ran, result, args, kwargs))
        return -1 if ran != extend.DONE else result

    extend.guard(vars(Loop)["step"], stopped)
    return Loop, stops


def test_the_guard_hears_of_a_stop_with_how_far_the_function_got(hw: Any) -> None:
    extend = importlib.import_module("hookwrap.extend")
    Loop, stops = _woven(hw)
    loop, other = Loop(), Loop()
    assert loop.step(2) == 2 and stops == []  # nothing to run: the function alone

    def stop_before(self: Any, batch: int) -> int:
        raise hw.StopTraining("before")

    handle = hw.before(loop, "step", stop_before)
    assert loop.step(2, scale=3) == -1
    assert stops == [(extend.NOT_STARTED, None, (loop, 2), {"scale": 3})]  # the call's own arguments
    handle.remove()
    hw.before(loop, "step", lambda self, batch: batch + 1)  # changes the argument

    def stop_after(self: Any, return_value: int) -> int:
        raise hw.StopTraining("after")

    hw.after(loop, "step", stop_after)
    assert loop.step(2, scale=3) == 9  # the function ran, with the changed batch: its result
    assert stops[-1] == (extend.DONE, 9, (loop, 2), {"scale": 3})
    assert other.step(2) == 2 and len(stops) == 2  # another instance, no callbacks


def test_a_stop_midway_and_the_guards_other_parts(hw: Any) -> None:
    extend = importlib.import_module("hookwrap.extend")
    seen: list[Any] = []

    class Loop:
        def step(self, batch: int) -> int:
            if batch < 0:
                raise hw.StopTraining("inside")
            return batch

    extend.weave_only(Loop, "step")

    def stopped(obj: Any, exc: Any, ran: int, result: Any, args: Any, kwargs: Any) -> Any:
        seen.append(("stopped", ran))
        raise exc

    extend.guard(vars(Loop)["step"], stopped, admit=lambda obj: obj.admitted,
                 changed=lambda obj, original, result: seen.append(("changed", original, result)))
    loop = Loop()
    loop.admitted = True  # type: ignore[attr-defined]
    errors: list[str] = []
    hw.on_error(loop, "step", lambda self, exception: errors.append(type(exception).__name__))
    with pytest.raises(hw.StopTraining, match="inside"):
        loop.step(-1)
    assert seen == [("stopped", extend.STARTED)] and errors == []  # a StopTraining is no failure
    hw.after(loop, "step", lambda self, return_value: return_value * 10)
    assert loop.step(2) == 20 and seen[-1] == ("changed", 2, 20)
    loop.admitted = False  # type: ignore[attr-defined]
    assert loop.step(2) == 2 and len(seen) == 2  # not admitted: the function alone


def test_around_advice_runs_inside_the_guard(hw: Any) -> None:
    Loop, stops = _woven(hw)
    loop = Loop()

    def twice(self: Any, proceed: Any, batch: int, scale: int = 1) -> int:
        return proceed(batch, scale) * 2

    hw.around(loop, "step", twice)
    assert loop.step(3) == 6 and stops == []

    def stop(self: Any, proceed: Any, batch: int, scale: int = 1) -> int:
        proceed(batch, scale)
        raise hw.StopTraining("after proceed")

    hw.around(loop, "step", stop)
    assert loop.step(3) == 3 and stops[-1][0] == importlib.import_module("hookwrap.extend").DONE


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
    with pytest.raises(hw.HookError, match="stopped must be callable"):
        extend.guard(vars(Loop)["step"], 3)
    with pytest.raises(hw.HookError, match="admit must be callable"):
        extend.guard(vars(Loop)["step"], lambda *a: None, admit=3)
    extend.guard(vars(Loop)["step"], lambda *a: None)
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


def test_the_guard_runs_on_every_call_once_the_chain_is_planned(hw: Any) -> None:
    # The pure twin plans a runner per call shape and its dispatch functions call
    # a planned runner directly: a guarded join point's runner must not be that one.
    Loop, stops = _woven(hw)
    loop = Loop()

    def stop_after(self: Any, return_value: int) -> int:
        raise hw.StopTraining("after")

    hw.after(loop, "step", stop_after)
    for n in range(1, 5):
        assert loop.step(n) == n and loop.step(n, scale=2) == 2 * n and loop.step(batch=n) == n
    assert len(stops) == 12
