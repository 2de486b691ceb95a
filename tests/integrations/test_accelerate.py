"""hookwrap.integrations.accelerate: a user-written loop on a real ``Accelerator``
(CPU), a linear model, synthetic data."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.third_party

torch = pytest.importorskip("torch", reason="needs the torch extra")
accelerate = pytest.importorskip("accelerate", reason="needs the thirdparty extra (accelerate)")


def prepared(lr: float = 0.1) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    accelerator = accelerate.Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def train(accelerator: Any, model: Any, optimizer: Any, steps: int, nan_at: int | None = None) -> int:
    """The user's loop; returns the steps it completed."""
    g = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == nan_at:
            loss = loss * float("nan")
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if accelerator.check_trigger():
            return step
    return steps


def weights(model: Any) -> Any:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def test_nan_guard_checks_the_loss_passed_to_backward(hw, preset):
    from hookwrap.torch import NanGuard, NonFiniteError

    with preset.weave():
        accelerator, model, optimizer = prepared()
        guard = NanGuard(events=("backward",), sync=True)  # the user's loop: no epoch/fit join point
        hw.add_callback(accelerator, guard)
        with pytest.raises(NonFiniteError, match="nan"):
            train(accelerator, model, optimizer, steps=5, nan_at=3)
        assert guard.checked == 3


def test_backward_and_optimizer_step_are_events_of_the_accelerator(hw, preset):
    from hookwrap.torch import GradNorm, LRMonitor

    with preset.weave():
        accelerator, model, optimizer = prepared(lr=0.1)
        hw.before(accelerator, "backward", lambda self, loss: loss * 0.0)  # nothing is learned
        grads, lrs = GradNorm(model=model), LRMonitor(optimizer=optimizer)
        hw.add_callback(accelerator, grads)
        hw.add_callback(accelerator, lrs)
        before = weights(model)
        assert train(accelerator, model, optimizer, steps=3) == 3
        assert torch.equal(weights(model), before)
        assert [n for _, n in grads.history] == [0.0] * 3 and lrs.history == [(1, [pytest.approx(0.1)])]  # update 1
        steps = []
        hw.after(accelerator, "optimizer_step", lambda self: steps.append(1))
        other, other_model, other_optimizer = prepared()  # another accelerator's optimizer: its own events
        train(other, other_model, other_optimizer, steps=2)
        train(accelerator, model, optimizer, steps=2)
        assert len(steps) == 2


def test_stop_training_raises_into_the_loop_or_sets_the_trigger(hw, preset):
    def stop_at_2(self):
        calls.append(1)
        if len(calls) == 2:
            raise hw.StopTraining("two")

    with preset.weave():
        accelerator, model, optimizer = prepared()
        calls: list[int] = []
        hw.before(accelerator, "backward", stop_at_2)
        with pytest.raises(hw.StopTraining, match="two"):
            train(accelerator, model, optimizer, steps=5)
    with preset.weave(stop="trigger") as handle:
        accelerator, model, optimizer = prepared()
        calls = []
        hw.before(accelerator, "backward", stop_at_2)
        before = weights(model)
        assert train(accelerator, model, optimizer, steps=5) == 2  # the loop broke on check_trigger()
        assert not torch.equal(weights(model), before) and str(handle.stopped) == "two"
    with pytest.raises(hw.HookError, match="stop must be 'raise'"):
        preset.weave(stop="halt")


def test_remove_restores(hw, preset):
    from accelerate.optimizer import AcceleratedOptimizer

    classes = (accelerate.Accelerator, AcceleratedOptimizer)
    before = [dict(vars(c)) for c in classes]
    handle = preset.weave()
    assert set(handle.events) == {"backward", "optimizer_step"}
    handle.remove()
    assert [dict(vars(c)) for c in classes] == before
    accelerator, model, optimizer = prepared()
    with pytest.raises(hw.UnknownEventError):
        hw.before(accelerator, "backward", lambda self: None)


def test_optimizer_step_fires_once_per_real_update_under_accumulation(hw, preset):
    """accelerate's own accumulation (``accelerator.accumulate``): ``optimizer.step()`` is
    called every batch and skips until the gradients are synchronized; the event is the
    update, counted as Adam counts its own steps and as accelerate's scheduler steps."""
    from hookwrap.torch import EMA, LRMonitor

    with preset.weave():
        torch.manual_seed(0)
        accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        updates: list[int] = []
        hw.after(accelerator, "optimizer_step", lambda self: updates.append(1))
        ema, lrs = EMA(0.9, eval_event=None, model=model), LRMonitor(optimizer=optimizer)
        hw.add_callback(accelerator, ema)
        hw.add_callback(accelerator, lrs)
        g = torch.Generator().manual_seed(1)
        for _ in range(24):
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        adam_steps = int(optimizer.optimizer.state[model.weight]["step"])
        assert adam_steps == 12 and len(updates) == 12
        assert ema.updates == 12
        assert [lr for _, (lr,) in lrs.history] == pytest.approx([0.1 * 0.5 ** i for i in range(12)])


def test_grad_accumulation_is_refused_naming_accelerate_own(hw, preset):
    from hookwrap.torch import GradAccumulation

    with preset.weave():
        accelerator, _, _ = prepared()
        with pytest.raises(hw.HookError, match=r"accumulates gradients itself.*accelerator.accumulate"):
            hw.add_callback(accelerator, GradAccumulation(2, loss_event="backward"))


def test_grad_scaler_is_refused_naming_accelerate_own_mixed_precision(hw, preset):
    from hookwrap.torch import GradScaler

    with preset.weave():
        accelerator, _, _ = prepared()
        with pytest.raises(hw.HookError, match=r"scales the loss itself.*mixed_precision='fp16'"):
            hw.add_callback(accelerator, GradScaler("cpu"))


def test_callback_state_saved_and_loaded_with_accelerate_state(hw, preset, tmp_path):
    """hw.CallbackState(accelerator) registered for checkpointing: accelerator.save_state
    carries the callbacks' state, load_state gives it back."""
    from hookwrap.torch import LRMonitor

    with preset.weave():
        accelerator, model, optimizer = prepared()
        monitor = LRMonitor(optimizer=optimizer, step_event="backward")
        hw.add_callback(accelerator, monitor)
        accelerator.register_for_checkpointing(hw.CallbackState(accelerator))
        train(accelerator, model, optimizer, steps=3)
        accelerator.save_state(str(tmp_path / "state"))
        assert monitor.step == 3
        fresh, fresh_model, fresh_optimizer = prepared()
        again = LRMonitor(optimizer=fresh_optimizer, step_event="backward")
        hw.add_callback(fresh, again)
        fresh.register_for_checkpointing(hw.CallbackState(fresh))
        fresh.load_state(str(tmp_path / "state"))
        assert again.step == 3


def test_a_crafted_callback_state_runs_no_code_on_load_state(hw, preset, tmp_path):
    """accelerate loads a registered object's state with weights_only=False; hookwrap's
    CallbackState is read with weights_only=True under the preset: a crafted pickle in
    the folder is refused, naming the file, and runs nothing."""
    from hookwrap.torch import LRMonitor
    from tests.torch._crafted import OpensAFile

    marker = tmp_path / "marker"
    with preset.weave():
        accelerator, model, optimizer = prepared()
        hw.add_callback(accelerator, LRMonitor(optimizer=optimizer, step_event="backward"))
        accelerator.register_for_checkpointing(hw.CallbackState(accelerator))
        train(accelerator, model, optimizer, steps=1)
        accelerator.save_state(str(tmp_path / "state"))
        (custom,) = (tmp_path / "state").glob("custom_checkpoint_*.pkl")
        torch.save({"LRMonitor": OpensAFile(marker)}, custom)
        fresh, _, fresh_optimizer = prepared()
        hw.add_callback(fresh, LRMonitor(optimizer=fresh_optimizer, step_event="backward"))
        fresh.register_for_checkpointing(hw.CallbackState(fresh))
        with pytest.raises(hw.HookError, match=r"custom_checkpoint_0\.pkl.*holds more than tensors and plain data"):
            fresh.load_state(str(tmp_path / "state"))
    assert not marker.exists()


def test_callbacks_count_the_updates_accelerate_runs(hw, preset):
    """Under accelerator.accumulate(model), 4 batches an update: a step is an update, so
    GradNorm measures once per update (the accumulated gradients, as the update sees them)
    and NanGuard names the update of the batch whose loss is NaN."""
    from hookwrap.torch import GradNorm, NanGuard, NonFiniteError

    def run(nan_at: int | None = None) -> list[float]:
        torch.manual_seed(0)
        accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
        model = torch.nn.Linear(4, 1)
        model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        grads = GradNorm(model=model)
        hw.add_callback(accelerator, grads)
        hw.add_callback(accelerator, NanGuard(events=("backward",), sync=True))
        seen: list[float] = []  # the norm the update applies
        hw.before(accelerator, "optimizer_step", lambda self: seen.append(float(torch.linalg.vector_norm(
            torch.cat([p.grad.flatten() for p in model.parameters()])))))
        g = torch.Generator().manual_seed(1)
        for batch in range(1, 17):
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss * float("nan") if batch == nan_at else loss)
                optimizer.step()
                optimizer.zero_grad()
        assert grads.history == [(step, pytest.approx(norm)) for step, norm in zip(range(1, 5), seen)]
        return seen

    from accelerate.state import AcceleratorState, GradientState

    try:
        with preset.weave():
            assert len(run()) == 4
            with pytest.raises(NonFiniteError, match=r"at step 3\b"):
                run(nan_at=9)  # the first batch of update 3
    finally:  # accelerate's state is one per process: the next Accelerator must not accumulate 4
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
