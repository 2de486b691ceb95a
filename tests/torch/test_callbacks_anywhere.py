"""Shipped callbacks on every kind of join point: plain and woven module functions,
staticmethods, classes woven with their own event names; values read from the
join point's arguments first; attached with ``hw.add_callback`` to any target; on
the global tier, attached where they fit."""

from __future__ import annotations

import math
import types
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")


@pytest.fixture
def shipped(hw: Any) -> Any:
    import hookwrap.torch as shipped_module  # re-imported with the hw under test

    return shipped_module


def test_shipped_callbacks_on_a_plain_hookable_function(hw, shipped):
    @hw.hookable
    def step(loss: float) -> float:
        return loss

    timer, guard = shipped.StepTimer(), shipped.NanGuard(events="step")
    with hw.add_callback(step, timer), hw.add_callback(step, guard):
        for loss in (0.5, 0.4):
            step(loss)
        assert timer.count == 2 and guard.step == 2 and guard.checked == 2
        with pytest.raises(shipped.NonFiniteError, match=r"argument 'loss' of 'step' was nan at step 3\. Stopping"):
            step(math.nan)
    step(math.nan)  # removed with its handle
    assert timer.count == 3


def test_early_stopping_on_a_function_returning_metrics(hw, shipped):
    @hw.hookable
    def evaluate(val_loss: float) -> dict[str, float]:
        return {"val_loss": val_loss}

    stop = shipped.EarlyStopping("val_loss", patience=1)
    hw.add_callback(evaluate, stop)
    evaluate(1.0)
    with pytest.raises(hw.StopTraining, match="val_loss has not improved"):
        evaluate(2.0)


def test_a_plain_function_named_step_does_not_block_the_global_tier(hw, shipped):
    @hw.hookable
    def step(engine: Any, batch: Any) -> None:  # an ignite-style update function
        pass

    class Loop(hw.Hookable):
        @hw.hookable
        def step(self, loss: float) -> float:
            return loss

    timer = shipped.StepTimer()
    with timer:  # global: attaches to both join points named step
        Loop().step(1.0)
        step(None, None)
    assert timer.count == 2


def test_a_global_function_callback_runs_where_it_fits(hw):
    class A(hw.Hookable):
        @hw.hookable
        def step(self, batch: int) -> int:
            return batch

    seen = []
    with hw.register_global_callback(("pre-step", lambda self, batch: seen.append(batch) or batch)):
        class B(hw.Hookable):  # defined later, without `batch`: skipped, not broken
            @hw.hookable
            def step(self, x: int) -> int:
                return x

        assert (A().step(1), B().step(2)) == (1, 2)
        assert seen == [1]
        assert len(hw.describe(A, "pre-step").chains["pre-step"]) == 1
        assert hw.describe(B, "pre-step").chains["pre-step"] == []


def test_a_global_callback_that_fits_no_join_point_is_refused(hw):
    class A(hw.Hookable):  # an event name of this test's own: join points of other tests live on
        @hw.hookable
        def step_fitting_no_callback(self, batch: int) -> int:
            return batch

    with pytest.raises(hw.CallbackSignatureError, match="asks for 'nope'"):
        hw.register_global_callback(("pre-step_fitting_no_callback", lambda self, nope: nope))


def test_nan_guard_watches_the_loss_argument(hw, shipped):
    class Accelerator:  # accelerate's shape: backward(loss) returns None
        def backward(self, loss: Any, **kwargs: Any) -> None:
            loss.backward(**kwargs)

    with hw.weave(Accelerator, "backward"):
        accelerator = Accelerator()
        guard = shipped.NanGuard(events="backward")
        deferred = hw.add_callback(accelerator, guard)
        w = torch.ones(2, requires_grad=True)
        accelerator.backward((w * 2).sum())
        accelerator.backward((w * math.nan).sum())  # no epoch or fit join point: queued, no read
        assert guard.checked == 2
        with pytest.raises(shipped.NonFiniteError, match="argument 'loss' of 'backward' was nan"):
            deferred.remove()  # an ending: decided there (as at a signal, a script's end, exit)
        exact = shipped.NanGuard(events="backward", sync=True)
        hw.add_callback(accelerator, exact)
        with pytest.raises(shipped.NonFiniteError, match="argument 'loss' of 'backward' was nan"):
            accelerator.backward((w * math.nan).sum())
        assert exact.checked == 1


def test_nan_guard_refuses_a_join_point_with_nothing_to_check(hw, shipped):
    class Loop(hw.Hookable):
        @hw.hookable
        def backward(self, scale: float) -> None:
            pass

    with pytest.raises(hw.CallbackSignatureError, match="returns None and has no argument 'loss'"):
        Loop().add_callback(shipped.NanGuard(events="backward"))


def test_monitors_read_the_optimizer_and_model_from_arguments(hw, shipped):
    class LightningLike(hw.Hookable):  # optimizer_step(epoch, batch_idx, optimizer)
        @hw.hookable
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            optimizer.step()

        @hw.hookable
        def backward(self, loss: Any, model: Any) -> None:
            loss.backward()

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    loop = LightningLike()  # no `optimizer` or `model` attribute
    lrs, norms = shipped.LRMonitor(), shipped.GradNorm()
    loop.add_callback(lrs)
    loop.add_callback(norms)
    loss = model(torch.ones(1, 2)).sum()
    loop.backward(loss, model)
    loop.optimizer_step(0, 0, optimizer)
    assert lrs.last == [0.25]
    expected = float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())
    assert norms.last == pytest.approx(expected)


def test_monitors_on_a_function_without_the_value_are_refused(hw, shipped):
    @hw.hookable
    def optimizer_step(epoch: int) -> None:
        pass

    with pytest.raises(hw.CallbackSignatureError, match="has no argument 'optimizer'.*Pass optimizer="):
        hw.add_callback(optimizer_step, shipped.LRMonitor())


def test_best_checkpoint_reads_model_and_optimizer_from_arguments(hw, shipped, tmp_path):
    # A script's functions: evaluate(model) returns the loss, fit(model, optimizer) runs.
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scores = iter([0.9, 0.5, 0.7])
    snapshots = []

    @hw.hookable
    def evaluate(model: Any) -> float:
        snapshots.append(model.weight.detach().clone())
        return next(scores)

    @hw.hookable
    def fit(model: Any, optimizer: Any) -> None:
        for _ in range(3):
            model.weight.grad = torch.ones_like(model.weight)
            optimizer.step()
            evaluate(model)

    script = types.ModuleType("script")  # attached to a module of functions, as hookwrap run's are
    script.evaluate, script.fit = evaluate, fit
    path = tmp_path / "best.pt"
    saver = shipped.BestCheckpoint(path, monitor="return_value", optimizer=optimizer, restore_best=True)
    with hw.add_callback(script, saver):
        fit(model, optimizer)
    assert saver.saved == 2 and saver.best.value == 0.5
    assert torch.equal(model.weight, snapshots[1])  # restored to the best, after fit
    assert not torch.equal(snapshots[1], snapshots[2])
    saved = torch.load(path, weights_only=True)
    assert saved["optimizer"]["param_groups"][0]["lr"] == 0.1
    assert not saver._held  # nothing kept between calls


def test_best_checkpoint_on_a_function_without_the_model_is_refused(hw, shipped, tmp_path):
    @hw.hookable
    def evaluate(loader: Any) -> float:
        return 0.5

    with pytest.raises(hw.CallbackSignatureError, match="has no argument 'model' to read the model from.*Pass model="):
        hw.add_callback(evaluate, shipped.BestCheckpoint(tmp_path / "b.pt", monitor="return_value", optimizer=None))
    with pytest.raises(hw.CallbackSignatureError, match="has no argument 'optimizer'.*Pass optimizer="):
        hw.add_callback(evaluate, shipped.BestCheckpoint(tmp_path / "b.pt", monitor="return_value",
                                                         model=torch.nn.Linear(1, 1)))
    evaluate(None)
    assert not (tmp_path / "b.pt").exists()


def test_add_callback_on_one_instance_of_a_woven_class(hw, shipped):
    class Trainer:  # a third-party trainer with an add_callback of its own
        callbacks: list[Any] = []

        def add_callback(self, cb: Any) -> None:
            self.callbacks.append(cb)

        def training_step(self, loss: float) -> float:
            return loss

    with hw.weave(Trainer, step="training_step"):
        one, other = Trainer(), Trainer()
        timer = shipped.StepTimer()
        handle = hw.add_callback(one, timer)
        one.training_step(1.0)
        other.training_step(1.0)
        assert timer.count == 1 and Trainer.callbacks == []
        handle.remove()
        one.training_step(1.0)
        assert timer.count == 1


def test_add_callback_on_a_module_of_woven_functions(hw, shipped, tmp_path, monkeypatch):
    (tmp_path / "script_like.py").write_text(
        "def train_step(loss):\n    return loss\n\ndef test_step(loss):\n    return loss\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import script_like

    with hw.weave(script_like, step="train_step", evaluate="test_step"):
        guard = shipped.NanGuard(events="step")
        hw.add_callback(script_like, guard)
        script_like.train_step(1.0)
        script_like.test_step(math.nan)  # not watched
        with pytest.raises(shipped.NonFiniteError):
            script_like.train_step(math.nan)
        with pytest.raises(hw.UnknownEventError, match="has no join point 'los'"):
            hw.add_callback(script_like, shipped.NanGuard(events="los"))


def test_shipped_callbacks_on_a_staticmethod(hw, shipped):
    class Loop(hw.Hookable):
        @hw.hookable
        @staticmethod
        def step(loss: float) -> float:
            return loss

    timer = shipped.StepTimer()
    hw.add_callback(Loop, timer)  # class tier: a staticmethod has no instance
    Loop.step(1.0)
    Loop().step(1.0)
    assert timer.count == 2
