"""``hookwrap.hooks_off()``: a block in which every join point runs as its plain
function and every emit reaches no callback, then everything as it was."""

from __future__ import annotations

import threading
from typing import Any

import pytest


def _rig(hw: Any) -> tuple[Any, Any, list[Any]]:
    """A hookable object with a callback on each tier, around advice, a function
    join point and a custom event; ``seen`` records what ran."""
    seen: list[Any] = []

    class Trainer(hw.Hookable):
        emits = ("on_eval",)

        @hw.hookable
        def step(self, i: int) -> int:
            return i

    @hw.hookable
    def loss(x: float) -> float:
        return x

    trainer = Trainer()
    hw.after(Trainer, "step", lambda self, i: seen.append(("class", i)))
    trainer.after("step", lambda self, i: seen.append(("instance", i)))
    trainer.around("step", lambda self, proceed, i: proceed(i) * 10)
    trainer.on("on_eval", lambda self, value: seen.append(("emit", value)))
    handles = [hw.register_global_callback(("post-step", lambda obj, i: seen.append(("global", i)))),
               loss.after(lambda x: seen.append(("function", x)))]

    def run(i: int) -> int:
        result = trainer.step(i)
        loss(i)
        hw.emit(trainer, "on_eval", value=i)
        return result

    run.handles = handles  # type: ignore[attr-defined]
    return trainer, run, seen


def _all(i: int) -> list[Any]:
    return [("class", i), ("instance", i), ("global", i), ("function", i), ("emit", i)]


def test_no_callback_runs_in_the_block_and_all_run_again_after(hw):
    trainer, run, seen = _rig(hw)
    assert run(1) == 10 and seen == _all(1)
    seen.clear()
    with hw.hooks_off():
        assert run(2) == 2  # the around advice is off too: the plain function's result
        trainer.after("step", lambda self, i: seen.append(("registered in the block", i)))
        assert run(3) == 3
    assert seen == []
    assert run(4) == 40
    assert seen == _all(4)[:2] + [("registered in the block", 4)] + _all(4)[2:]
    for handle in run.handles:
        handle.remove()


def test_blocks_nest_and_an_exception_leaving_one_turns_the_hooks_back_on(hw):
    _, run, seen = _rig(hw)
    with pytest.raises(RuntimeError, match="evaluation failed"):
        with hw.hooks_off():
            with hw.hooks_off():
                run(1)
            run(2)  # still inside the outer block
            raise RuntimeError("evaluation failed")
    assert seen == []
    run(3)
    assert seen == _all(3)
    for handle in run.handles:
        handle.remove()


def test_the_block_holds_for_every_thread(hw):
    """Process-wide, as its docstring says: a call in another thread inside the block
    runs no callback either."""
    _, run, seen = _rig(hw)
    with hw.hooks_off():
        worker = threading.Thread(target=run, args=(5,))
        worker.start()
        worker.join()
    assert seen == []
    worker = threading.Thread(target=run, args=(6,))
    worker.start()
    worker.join()
    assert seen == _all(6)
    for handle in run.handles:
        handle.remove()


def test_a_torch_evaluation_in_the_block_is_not_logged(hw, tmp_path):
    """The use it is for: an evaluation outside the run's bookkeeping. MetricsLogger
    logs the training losses and the evaluation of the run, not the one in the block."""
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    from hookwrap.torch import MetricsLogger

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model = torch.nn.Linear(2, 1)

        @hw.hookable
        def step(self, x: Any) -> None:
            self.loss(x)

        @hw.hookable
        def loss(self, x: Any) -> Any:
            return self.model(x).pow(2).mean()

        @hw.hookable
        def evaluate(self) -> dict[str, float]:
            with torch.no_grad():
                return {"val_loss": float(self.loss(torch.ones(3, 2)))}

    loop = Loop()
    logger = MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    loop.add_callback(logger)
    loop.step(torch.zeros(3, 2))
    with hw.hooks_off():
        loop.evaluate()
    loop.evaluate()
    assert [name for _, name, _ in logger.read()] == ["loss", "loss", "val_loss"]  # the run's evaluation alone
