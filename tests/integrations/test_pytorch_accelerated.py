"""hookwrap.integrations.pytorch_accelerated on a real pytorch-accelerated Trainer: a
torch.nn.Linear, synthetic regression data, CPU. Compared with PA's own callbacks on
the same runs (same seeds)."""

from __future__ import annotations

import os
from typing import Any

import pytest

pytestmark = pytest.mark.third_party

torch = pytest.importorskip("torch", reason="needs the torch extra")
pa = pytest.importorskip("pytorch_accelerated", reason="needs the thirdparty extra (pytorch-accelerated)")

from pytorch_accelerated.callbacks import (CallbackHandler, EarlyStoppingCallback,  # noqa: E402
                                           SaveBestModelCallback, TrainerCallback)

BATCH = 8


def data(n: int, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.3 * torch.randn(n, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


class Ends(TrainerCallback):
    """Notes PA's own end-of-run events."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_stop_training_error(self, trainer: Any, **kwargs: Any) -> None:
        self.seen.append("stop")

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        self.seen.append("end")


def tiny(*pa_callbacks: Any) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return pa.Trainer(model=model, loss_func=torch.nn.MSELoss(), callbacks=list(pa_callbacks),
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.05))


def fit(trainer: Any, epochs: int = 40, train_size: int = 64, **kwargs: Any) -> None:
    trainer.train(train_dataset=data(train_size, 0), eval_dataset=data(32, 1), num_epochs=epochs,
                  per_device_batch_size=BATCH, **kwargs)


def weights(trainer: Any) -> Any:
    return torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])


def epochs_run(trainer: Any) -> int:
    return len(trainer.run_history.get_metric_values("eval_loss_epoch"))


def test_early_stopping_stops_where_pa_early_stopping_callback_does(hw, preset):
    """patience 2, threshold 0.01: PA stops after epoch 7 (best at epoch 5); hookwrap's
    EarlyStopping on the same run stops there too, the PA way: PA's epoch loop breaks
    on a StopTrainingError and its end-of-run events run."""
    from hookwrap.torch import EarlyStopping

    ends = Ends()
    own = tiny(EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.01), ends)
    fit(own)
    assert epochs_run(own) == 7 and ends.seen == ["stop", "end"]
    with preset.weave() as handle:
        ends = Ends()
        woven = tiny(ends)
        stopping = EarlyStopping("eval_loss_epoch", patience=2, min_delta=0.01)
        hw.add_callback(woven, stopping)
        fit(woven)
    assert woven.run_history.get_metric_values("eval_loss_epoch") == own.run_history.get_metric_values(
        "eval_loss_epoch")
    assert ends.seen == ["stop", "end"] and isinstance(handle.stopped, hw.StopTraining)
    assert woven.run_history.current_epoch == own.run_history.current_epoch == 7  # not incremented on a stop
    assert stopping.best_step == 5 * 8 and stopping.step == 7 * 8 and stopping.wait == 2
    assert torch.equal(weights(woven), weights(own))


def test_best_checkpoint_keeps_the_weights_save_best_model_callback_keeps(hw, preset, tmp_path):
    """The same run: PA's SaveBestModelCallback and EarlyStoppingCallback reload epoch 6's
    weights (eval loss 0.1465, epoch 7's is 0.1479); hookwrap's BestCheckpoint under
    hookwrap's EarlyStopping restores the same, and PA's SaveBestModelCallback, when
    hookwrap stopped the run, still reloads its best at the run's end (which leaves the
    hookwrap callbacks' state alone)."""
    from hookwrap.torch import BestCheckpoint, EarlyStopping

    own = tiny(SaveBestModelCallback(save_path=str(tmp_path / "pa.pt")),
               EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.01))
    last: dict[str, Any] = {}
    fit(own)
    assert epochs_run(own) == 7
    with preset.weave():
        woven = tiny()
        best = BestCheckpoint(tmp_path / "best.pt", monitor="eval_loss_epoch", restore_best=True)
        hw.add_callback(woven, best)
        hw.add_callback(woven, EarlyStopping("eval_loss_epoch", patience=2, min_delta=0.01))
        hw.after(woven, "evaluate", lambda self, return_value: last.update(w=weights(self)) or return_value)
        fit(woven)
        assert best.best_step == 6 * 8 and best.best.value == min(own.run_history.get_metric_values("eval_loss_epoch"))
        assert torch.equal(weights(woven), weights(own)) and not torch.equal(weights(woven), last["w"])

        ends = Ends()
        mixed = tiny(SaveBestModelCallback(save_path=str(tmp_path / "mixed.pt")), ends)
        stopping = EarlyStopping("eval_loss_epoch", patience=2, min_delta=0.01)
        hw.add_callback(mixed, stopping)
        fit(mixed)
        assert ends.seen == ["stop", "end"] and epochs_run(mixed) == 7
        assert torch.equal(weights(mixed), weights(own))  # PA's reload of its best ran
        assert stopping.wait == 2 and stopping.step == 7 * 8  # not put back by that reload


def test_stop_from_a_step_callback_finishes_that_step(hw, preset):
    with preset.weave():
        ends = Ends()
        trainer = tiny(ends)
        batches: list[int] = []

        def stop_at_3(self):
            batches.append(1)
            if len(batches) >= 3:
                raise hw.StopTraining("enough")

        updates: list[int] = []
        hw.before(trainer, "step", stop_at_3)  # the 3rd batch still runs and updates, then PA stops
        hw.after(trainer, "optimizer_step", lambda self: updates.append(1))
        fit(trainer, epochs=5)
        assert len(batches) == len(updates) == 3 and ends.seen == ["stop", "end"]
        assert trainer.run_history.get_metric_values("eval_loss_epoch") == []  # stopped within epoch 1
        with pytest.raises(hw.StopTraining):  # outside train() there is no run to stop
            trainer._perform_forward_and_backward_passes(next(iter(trainer._train_dataloader)), 0)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_callbacks_number_steps_in_pa_optimizer_updates(hw, preset, tmp_path, accumulate):
    """56 samples, batches of 8: 7 batches an epoch; accumulating 2, PA updates 4 times an
    epoch (its last batch updates alone), as its run_config says. Checkpoint's files,
    EarlyStopping's best and last step and MetricsLogger's rows are at those updates."""
    from hookwrap.torch import Checkpoint, EarlyStopping, MetricsLogger

    with preset.weave():
        trainer = tiny()
        scripted = iter([3.0, 1.0, 2.0])  # the best after epoch 2
        hw.after(trainer, "evaluate", lambda self, return_value: {**return_value, "eval_loss_epoch": next(scripted)})
        updates: list[int] = []
        hw.after(trainer, "optimizer_step", lambda self: updates.append(1))
        every = Checkpoint(tmp_path / "ck", every_n_steps=2)
        early = EarlyStopping("eval_loss_epoch", patience=100)
        log = MetricsLogger(tmp_path / "m.csv", tensorboard=False)
        for cb in (every, early, log):
            hw.add_callback(trainer, cb)
        fit(trainer, epochs=3, train_size=56, gradient_accumulation_steps=accumulate)
        rows = log.read()
    per_epoch = trainer.run_config.num_update_steps_per_epoch
    assert per_epoch == (7 if accumulate == 1 else 4) and len(updates) == 3 * per_epoch
    total = 3 * per_epoch
    assert sorted(os.listdir(tmp_path / "ck")) == sorted(
        ["last.pt", *(f"step={n}.pt" for n in range(2, total + 1, 2))])
    assert early.best_step == 2 * per_epoch and early.step == total
    assert early.state_dict()["step_axis"] == "updates"
    evaluated = [step for step, name, _ in rows if name == "eval_loss_epoch"]
    assert evaluated == [per_epoch, 2 * per_epoch, 3 * per_epoch]
    assert {step for step, _, _ in rows} <= set(range(1, total + 1))


def test_callback_state_goes_through_save_and_load_checkpoint(hw, preset, tmp_path):
    """save_checkpoint writes the callbacks' state into PA's file (plain data, read
    weights_only), load_checkpoint gives it back: the resumed EarlyStopping keeps its
    wait and stops after 3 more epochs, as the straight run does after 6 (afresh: 6 more)."""
    from hookwrap.torch import EarlyStopping

    def never_improving() -> Any:
        return EarlyStopping("eval_loss_epoch", patience=5, min_delta=100.0)

    with preset.weave():
        straight, stopping = tiny(), never_improving()
        hw.add_callback(straight, stopping)
        fit(straight)
        assert epochs_run(straight) == 6

        first, stopping = tiny(), never_improving()
        hw.add_callback(first, stopping)
        fit(first, epochs=3)
        assert stopping.wait == 2
        first.save_checkpoint(str(tmp_path / "ck.pt"))
        saved = torch.load(tmp_path / "ck.pt", weights_only=True)
        assert saved[preset.STATE_KEY]["EarlyStopping[monitor=eval_loss_epoch,mode=min]"]["wait"] == 2

        resumed, stopping = tiny(), never_improving()
        hw.add_callback(resumed, stopping)
        resumed.load_checkpoint(str(tmp_path / "ck.pt"))
        assert stopping.wait == 2 and stopping.step == 3 * 8
        fit(resumed)
        assert epochs_run(resumed) == 3 and stopping.wait == 5 and stopping.step == 6 * 8


def test_callback_state_goes_through_pa_training_state(hw, preset, tmp_path):
    """train(resume_from=...) from a folder save_training_state wrote: PA resumes its
    epoch, and the callbacks their state (the run stops where the straight one does)."""
    from hookwrap.torch import EarlyStopping

    with preset.weave():
        first, stopping = tiny(), EarlyStopping("eval_loss_epoch", patience=5, min_delta=100.0)
        hw.add_callback(first, stopping)
        fit(first, epochs=3)
        first.save_training_state(str(tmp_path / "state"))
        assert (tmp_path / "state" / preset.STATE_FILE).is_file()
        resumed, stopping = tiny(), EarlyStopping("eval_loss_epoch", patience=5, min_delta=100.0)
        hw.add_callback(resumed, stopping)
        fit(resumed, resume_from=str(tmp_path / "state"))
        assert stopping.wait == 5 and stopping.step == 6 * 8 and epochs_run(resumed) == 3


def test_a_crafted_training_state_runs_no_code_on_resume(hw, preset, tmp_path):
    """The folder train(resume_from=...) reads is data, not code: a hookwrap_callbacks.pt
    whose pickle opens a file is refused, naming it, before anything runs."""
    from hookwrap.torch import EarlyStopping
    from tests.torch._crafted import OpensAFile

    marker = tmp_path / "marker"
    with preset.weave():
        first = tiny()
        hw.add_callback(first, EarlyStopping("eval_loss_epoch", patience=5))
        fit(first, epochs=1)
        first.save_training_state(str(tmp_path / "state"))
        state_file = tmp_path / "state" / preset.STATE_FILE
        assert torch.load(state_file, weights_only=True)  # what hookwrap writes is plain data
        torch.save({"EarlyStopping[monitor=eval_loss_epoch,mode=min]": OpensAFile(marker)}, state_file)
        resumed = tiny()
        hw.add_callback(resumed, EarlyStopping("eval_loss_epoch", patience=5))
        with pytest.raises(hw.HookError, match=r"hookwrap_callbacks\.pt.*holds more than tensors and plain data"):
            fit(resumed, resume_from=str(tmp_path / "state"))
    assert not marker.exists()


def test_grad_accumulation_and_checkpoint_resume_are_refused_naming_pa_own(hw, preset, tmp_path):
    from hookwrap.torch import Checkpoint, GradAccumulation

    with preset.weave():
        trainer = tiny()
        with pytest.raises(hw.HookError, match=r"accumulates gradients itself.*gradient_accumulation_steps=N"):
            hw.add_callback(trainer, GradAccumulation(2))
        with pytest.raises(hw.HookError, match=r"resumes it itself.*resume_from="):
            hw.add_callback(trainer, Checkpoint(tmp_path / "refused", resume_from="last"))


def test_remove_restores_every_attribute(hw, preset):
    def snapshot() -> Any:
        return [dict(vars(c)) for c in (pa.Trainer, CallbackHandler)]

    before = snapshot()
    handle = preset.weave()
    assert set(handle.events) == {"fit", "epoch", "step", "loss", "backward", "optimizer_step", "evaluate"}
    assert snapshot() != before
    handle.remove()
    handle.remove()  # idempotent
    assert snapshot() == before
    with pytest.raises(hw.UnknownEventError):
        hw.after(tiny(), "evaluate", lambda self: None)


def test_a_subclass_is_woven_and_bad_input_refused(hw, preset):
    class MyTrainer(pa.Trainer):
        def calculate_train_batch_loss(self, batch):
            return super().calculate_train_batch_loss(batch)

    with preset.weave(MyTrainer):
        trainer = MyTrainer(model=torch.nn.Linear(4, 1), loss_func=torch.nn.MSELoss(),
                            optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
        losses: list[float] = []
        hw.after(trainer, "loss", lambda self, return_value: losses.append(float(return_value.detach())) or return_value)
        trainer.model = torch.nn.Linear(4, 1)
        trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=0.05)
        fit(trainer, epochs=1)
        assert len(losses) == 8
    with pytest.raises(hw.HookError, match="pytorch-accelerated Trainer"):
        preset.weave(object)


def test_loss_is_pa_loss_and_a_replacement_reaches_backward(hw, preset):
    """``loss`` returns the tensor PA computes for a training batch; a callback that scales
    it to zero is what PA backpropagates and records: nothing is learned."""
    with preset.weave():
        trainer = tiny()
        seen: list[float] = []

        def zero(self, return_value):
            seen.append(float(return_value.detach()))
            return return_value * 0.0

        hw.after(trainer, "loss", zero)
        before = weights(trainer)
        fit(trainer, epochs=1)
        assert torch.equal(weights(trainer), before) and len(seen) == 8 and all(v > 0 for v in seen)
        assert trainer.run_history.get_latest_metric("train_loss_epoch") == 0.0
        assert trainer.run_history.get_latest_metric("eval_loss_epoch") > 1  # evaluation untouched


def test_every_shipped_callback_attaches_with_its_default_events(hw, preset, tmp_path):
    """Accumulating 2 over 8 batches: 4 updates an epoch. GradNorm and LRMonitor report once
    per update, MetricsLogger's loss rows are the updates' losses, the evaluations' rows at
    the epochs' last update."""
    import io

    from hookwrap.torch import (BestCheckpoint, EarlyStopping, GradNorm, LRMonitor, MetricsLogger, NanGuard,
                                ProgressBar, StepTimer)

    with preset.weave():
        trainer = tiny()
        log = MetricsLogger(tmp_path / "metrics.csv", tensorboard=False)
        bar, grads, lrs = io.StringIO(), GradNorm(logger=log), LRMonitor(logger=log)
        for cb in (ProgressBar(file=bar), log, StepTimer(), NanGuard(), grads, lrs,
                   EarlyStopping("eval_loss_epoch", patience=5),
                   BestCheckpoint(tmp_path / "best.pt", monitor="eval_loss_epoch")):
            hw.add_callback(trainer, cb)
        fit(trainer, epochs=2, gradient_accumulation_steps=2)
        rows = log.read()
    assert [step for step, _ in grads.history] == list(range(1, 9)) and all(n > 0 for _, n in grads.history)
    assert lrs.history[0] == (1, [pytest.approx(0.05)])
    assert [step for step, name, _ in rows if name == "eval_loss_epoch"] == [4, 8]
    assert [step for step, name, _ in rows if name == "loss"] == list(range(1, 9))
    assert "epoch 1" in bar.getvalue() and (tmp_path / "best.pt").exists()


def test_global_tier_early_stopping_decides_as_pa(hw, preset):
    """``with EarlyStopping(...)`` (the global tier, as ``hookwrap run`` registers) on the
    PA run of test_early_stopping_...: the same stop epoch as PA's EarlyStoppingCallback."""
    from hookwrap.torch import EarlyStopping

    with preset.weave():
        trainer = tiny()
        with EarlyStopping("eval_loss_epoch", patience=2, min_delta=0.01):
            fit(trainer)
    assert epochs_run(trainer) == 7
