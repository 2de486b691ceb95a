"""hookwrap.integrations.lightning on a real Lightning Trainer: a linear model,
synthetic data, CPU. The shipped callbacks run with their default events."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

pytestmark = [pytest.mark.third_party,
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

torch = pytest.importorskip("torch", reason="needs the torch extra")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pl = pytest.importorskip("lightning.pytorch", reason="needs the thirdparty extra (lightning)")


class Module(pl.LightningModule):
    def __init__(self, lr: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loader() -> Any:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)  # 4 batches


def trainer(epochs: int = 20) -> Any:
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)


def fitted(hw: Any, lr: float, epochs: int, callbacks: list[Any], hooked: list[Any]) -> Any:
    """A Module(lr) fitted with Lightning's ``callbacks`` and hookwrap's ``hooked``
    attached to it: the trainer, to compare where each stopped."""
    module = Module(lr=lr)
    for cb in hooked:
        hw.add_callback(module, cb)
    run = pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    run.fit(module, loader(), loader())
    return run


def weights(module: Any) -> Any:
    return torch.cat([p.detach().flatten().clone() for p in module.parameters()])


def test_early_stopping_sets_should_stop_and_fit_finishes(hw, preset):
    from hookwrap.torch import EarlyStopping, GradNorm, StepTimer

    with preset.weave(Module) as handle:
        module = Module(lr=0.0)  # nothing is learned: val_loss never improves after the first epoch
        evaluations = []
        hw.after(module, "evaluate", lambda self, return_value: evaluations.append(dict(return_value)) or return_value)
        timer, grads = StepTimer(), GradNorm(model=module)
        for cb in (EarlyStopping("val_loss", patience=2), timer, grads):
            hw.add_callback(module, cb)
        run = trainer(epochs=20)
        run.fit(module, loader(), loader())
        assert run.should_stop and run.state.status == pl.trainer.states.TrainerStatus.FINISHED
        assert run.current_epoch == 3 < 20  # epochs 1 (best), 2, 3 (patience 2 spent)
        assert len(evaluations) == 3 and all("val_loss" in m for m in evaluations)  # not the sanity check
        assert timer.count == 12 == run.global_step and len(grads.history) == 12
        assert isinstance(handle.stopped, hw.StopTraining)


@pytest.mark.parametrize("sync", [True, False])
def test_loss_scaled_to_zero_learns_nothing_and_nan_guard_stops(hw, preset, sync):
    from hookwrap.torch import NanGuard, NonFiniteError

    with preset.weave(Module):
        module = Module(lr=0.5)
        hw.after(module, "loss", lambda self, return_value: return_value * 0.0)
        before = weights(module)
        trainer(epochs=2).fit(module, loader())
        assert torch.equal(weights(module), before)

        module = Module(lr=0.5)
        calls = []

        def poison(self, return_value):
            calls.append(1)
            return return_value * float("nan") if len(calls) == 6 else return_value

        hw.after(module, "loss", poison)
        hw.add_callback(module, NanGuard(sync=sync))  # default events: loss, counted by step
        with pytest.raises(NonFiniteError, match=r"'post-loss' returned nan at step 6"):
            trainer(epochs=3).fit(module, loader())
        # sync=True: in the bad step; by default read back when that epoch ends (step 8).
        assert len(calls) == (6 if sync else 8)


def test_stop_from_a_step_callback(hw, preset):
    with preset.weave(Module) as handle:
        module = Module(lr=0.1)

        def stop_at_5(self, return_value):
            if self.trainer.global_step == 5:
                raise hw.StopTraining("five steps")
            return return_value

        hw.after(module, "step", stop_at_5)
        run = trainer(epochs=10)
        run.fit(module, loader())
        assert run.global_step == 5 and run.current_epoch == 2  # the second epoch, ended at its first batch
        assert run.state.status == pl.trainer.states.TrainerStatus.FINISHED
        assert str(handle.stopped) == "five steps"


def test_remove_restores_and_bad_input_is_refused(hw, preset):
    from lightning.pytorch.loops import _EvaluationLoop, _FitLoop, _TrainingEpochLoop

    from lightning.pytorch.core.optimizer import LightningOptimizer
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector
    from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector

    classes = (Module, _FitLoop, _TrainingEpochLoop, _EvaluationLoop, LightningOptimizer, _CheckpointConnector,
               _LoggerConnector)
    before = [dict(vars(c)) for c in classes]
    handle = preset.weave(Module)
    assert set(handle.events) == {"fit", "epoch", "step", "loss", "backward", "optimizer_step", "evaluate", "log"}
    handle.remove()
    assert [dict(vars(c)) for c in classes] == before
    module = Module(lr=0.5)
    trainer(epochs=1).fit(module, loader())  # un-woven: a plain run
    with pytest.raises(hw.HookError, match="pass your LightningModule subclass"):
        preset.weave(pl.LightningModule)
    with pytest.raises(hw.HookError, match=r"weave\(MyModule\)"):
        preset.weave()
    with pytest.raises(hw.HookError, match="expected your LightningModule subclass"):
        preset.weave(torch.nn.Linear)


class ManualModule(Module):
    """Lightning's manual optimization, as its docs write it: manual_backward, then opt.step()
    every ``accumulate`` batches."""

    def __init__(self, lr: float = 0.1, accumulate: int = 1) -> None:
        super().__init__(lr)
        self.automatic_optimization = False
        self.accumulate = accumulate

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt = self.optimizers()
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.manual_backward(loss / self.accumulate)
        if (batch_idx + 1) % self.accumulate == 0:
            opt.step()
            opt.zero_grad()
        return loss


@pytest.mark.parametrize("accumulate", [1, 2])
def test_manual_optimization_steps_and_the_loss_it_backpropagates(hw, preset, accumulate):
    """Each ``opt.step()`` is an optimizer_step, counted as Lightning counts global_step; the
    loss is scaled where manual_backward takes it; a change after it was used is refused."""
    from hookwrap.torch import LRMonitor

    with preset.weave(ManualModule):
        module = ManualModule(lr=0.5, accumulate=accumulate)
        steps, backwards = [], []
        hw.after(module, "optimizer_step", lambda self: steps.append(self.trainer.global_step))
        hw.before(module, "backward", lambda self, loss: backwards.append(1) or loss * 0.0)
        before = weights(module)
        run = trainer(epochs=2)
        run.fit(module, loader())
        assert run.global_step == 8 // accumulate == len(steps) and len(backwards) == 8
        assert torch.equal(weights(module), before)  # every loss backpropagated was scaled to 0

    with preset.weave(ManualModule):
        module = ManualModule(lr=0.5)
        hw.after(module, "loss", lambda self, return_value: return_value * 0.0)
        with pytest.raises(hw.HookError, match="manual optimization.*Change it on 'backward'"):
            trainer(epochs=1).fit(module, loader())
        module = ManualModule(lr=0.5)
        seen = []
        hw.after(module, "loss", lambda self, return_value: seen.append(float(return_value)) or return_value)
        trainer(epochs=1).fit(module, loader())
        assert len(seen) == 4


def test_automatic_accumulation_counts_updates(hw, preset):
    with preset.weave(Module):
        module = Module(lr=0.1)
        steps, losses = [], []
        hw.after(module, "optimizer_step", lambda self: steps.append(1))
        hw.after(module, "loss", lambda self: losses.append(1))
        run = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2)
        run.fit(module, loader())
        assert len(steps) == run.global_step == 4 and len(losses) == 8


def test_validate_test_and_predict_outside_fit_are_no_evaluations(hw, preset, tmp_path):
    """The documented attach, then Lightning's other loops: nothing raised, and only
    fit's validation runs are evaluations (Lightning's EarlyStopping counts the same)."""
    from hookwrap.torch import BestCheckpoint, EarlyStopping, MetricsLogger, NanGuard

    class Tested(Module):
        def test_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("test_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch[0])

    with preset.weave(Tested):
        module = Tested(lr=0.1)
        stopping = EarlyStopping("val_loss", patience=5)
        logger = MetricsLogger(tmp_path / "m.csv", tensorboard=False)
        for cb in (stopping, BestCheckpoint(tmp_path / "best.pt", monitor="val_loss", model=module), logger,
                   NanGuard()):
            hw.add_callback(module, cb)
        evaluations = []
        hw.after(module, "evaluate", lambda self: evaluations.append(1))
        run = trainer(epochs=2)
        with pytest.warns(hw.HookwrapWarning, match="logged no training values in this run"):
            run.fit(module, loader(), loader())  # training_step logs nothing of its own: said, not silent
        run.validate(module, loader())
        run.test(module, loader())
        assert "test_loss" in {name for _, name, _ in logger.csv.read()}  # outside fit: sent at once
        predictions = run.predict(module, loader())
        assert len(evaluations) == 2 and len(predictions) == 4
        assert stopping.best.value is not None
        assert set(torch.load(tmp_path / "best.pt", weights_only=False)["optimizer"]) == {"state", "param_groups"}
        names = {name for _, name, _ in logger.read()}
        assert {"val_loss", "test_loss"} <= names  # logged as Lightning logs them; only val_loss decided


def test_resume_from_a_lightning_checkpoint_restores_hookwrap_callbacks(hw, preset, tmp_path):
    """Lightning's checkpoint carries the callbacks' state, and fit(ckpt_path=...) restores
    it: the resumed run stops at the epoch the straight run stops at (3; 4 before)."""
    from hookwrap.torch import EarlyStopping

    def fit(epochs: int, ckpt_path: Any = None) -> tuple[Any, Any]:
        module = Module(lr=0.0)  # val_loss never improves after the first epoch
        stopping = EarlyStopping("val_loss", patience=2)
        hw.add_callback(module, stopping)
        run = trainer(epochs=epochs)
        run.fit(module, loader(), loader(), ckpt_path=ckpt_path)
        return run, stopping

    with preset.weave(Module):
        straight, _ = fit(20)
        first, stopping = fit(2)
        assert stopping.wait == 1
        first.save_checkpoint(tmp_path / "two.ckpt")
        assert torch.load(tmp_path / "two.ckpt", weights_only=False)[preset.STATE_KEY]
        resumed, stopping = fit(20, ckpt_path=tmp_path / "two.ckpt")
        assert resumed.current_epoch == straight.current_epoch == 3 and stopping.wait == 2


class Logging(Module):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss


@pytest.mark.parametrize("with_logger", [True, False])
def test_metrics_logger_logs_what_lightning_logs(hw, preset, tmp_path, with_logger):
    """The rows Lightning gives its loggers (self.log's values, every log_every_n_steps, its
    step and epoch), value for value, with accumulation; with no logger configured too."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from hookwrap.torch import MetricsLogger

    with preset.weave(Logging):
        module = Logging(lr=0.1)
        logger = MetricsLogger(tmp_path / "m.csv", tensorboard=False)
        hw.add_callback(module, logger)
        run = pl.Trainer(max_epochs=2, accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=1, accumulate_grad_batches=2,
                         logger=CSVLogger(tmp_path, name="pl") if with_logger else False)
        run.fit(module, loader(), loader())
        rows = logger.read()
    assert {name for _, name, _ in rows} == {"train_loss", "val_loss", "epoch"}
    if with_logger:
        with open(run.logger.experiment.metrics_file_path, newline="") as f:
            expected = sorted((int(r["step"]), name, float(value)) for r in csv.DictReader(f)
                              for name, value in r.items() if name != "step" and value != "")
        assert sorted(rows) == [(step, name, pytest.approx(value)) for step, name, value in expected]
    assert sorted({step for step, name, _ in rows if name == "train_loss"}) == [0, 1, 2, 3]  # updates


def test_grad_accumulation_is_refused_naming_lightning_own(hw, preset):
    from hookwrap.torch import GradAccumulation

    with preset.weave(Module):
        with pytest.raises(hw.HookError, match=r"accumulates gradients itself.*accumulate_grad_batches=N"):
            hw.add_callback(Module(), GradAccumulation(2))
    assert not hasattr(Module, "__hookwrap_accumulation__")


@pytest.mark.parametrize("min_delta", [0.002, 0.01])
def test_early_stopping_decides_as_lightning_early_stopping(hw, preset, min_delta):
    """The same run stopped by Lightning's EarlyStopping and by hookwrap's, with the same
    monitor, patience and min_delta: the same epoch and global step."""
    from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping

    from hookwrap.torch import EarlyStopping

    theirs = fitted(hw, 0.02, 60, [LightningEarlyStopping("val_loss", patience=2, min_delta=min_delta)], [])
    with preset.weave(Module):
        ours = fitted(hw, 0.02, 60, [], [EarlyStopping("val_loss", patience=2, min_delta=min_delta)])
    assert (ours.current_epoch, ours.global_step) == (theirs.current_epoch, theirs.global_step)
    assert theirs.current_epoch < 60


def test_manual_optimization_never_runs_an_optimizer_step_override(hw, preset):
    """Lightning never calls optimizer_step in manual optimization; routing opt.step()
    through the event must not call the module's override (woven, callbacks or none)."""

    class Overriding(ManualModule):
        calls = 0

        def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            type(self).calls += 1
            for group in self.optimizers().param_groups:
                group["lr"] = 0.0

    def changed(woven: bool) -> bool:
        module = Overriding(lr=0.5)
        before = weights(module)
        if woven:
            steps: list[int] = []
            hw.after(module, "optimizer_step", lambda self: steps.append(1))
        trainer(epochs=1).fit(module, loader())
        if woven:
            assert len(steps) == 4
        return not torch.equal(weights(module), before)

    assert changed(woven=False) and Overriding.calls == 0
    with preset.weave(Overriding):
        assert changed(woven=True) and Overriding.calls == 0


def test_resume_from_a_checkpoint_without_hookwrap_state_says_so(hw, preset, tmp_path):
    from hookwrap.torch import EarlyStopping

    run = trainer(epochs=1)
    run.fit(Module(lr=0.0), loader(), loader())  # not woven: its checkpoint has no hookwrap state
    run.save_checkpoint(tmp_path / "plain.ckpt")
    with preset.weave(Module):
        module = Module(lr=0.0)
        hw.add_callback(module, EarlyStopping("val_loss", patience=2))
        with pytest.warns(hw.HookwrapWarning, match=r"holds no hookwrap callback state: 'EarlyStopping"):
            trainer(epochs=2).fit(module, loader(), loader(), ckpt_path=tmp_path / "plain.ckpt")


def test_checkpoint_resume_is_refused_naming_lightnings_own(hw, preset, tmp_path):
    """Lightning keeps the run's position (trainer.global_step, its loops):
    Checkpoint's resume would put the weights back and fit again from step 0,
    silently (and before fit, reading the optimizers fails with Lightning's own
    error). Refused where it is set up, naming fit(ckpt_path=...)."""
    from hookwrap.torch import Checkpoint

    with preset.weave(Module):
        module = Module()
        for settings in ({"on_exception": True}, {"resume_from": "last"}):
            with pytest.raises(hw.HookError, match=r"resumes it itself.*ckpt_path"):
                hw.add_callback(module, Checkpoint(tmp_path / "refused", **settings))
        with pytest.raises(hw.HookError, match="ckpt_path"):
            Checkpoint(tmp_path / "ckpt").resume(module, "exception")


@pytest.mark.parametrize("accumulate", [1, 2])
def test_callbacks_number_steps_as_model_checkpoint_does(hw, preset, tmp_path, accumulate):
    """A step is Lightning's global_step (optimizer updates), with accumulation on and
    off: Checkpoint(every_n_steps=3) writes the steps ModelCheckpoint(every_n_train_steps=3)
    names, and BestCheckpoint's best step is the one in ModelCheckpoint's best file's name."""
    import os

    from lightning.pytorch.callbacks import ModelCheckpoint

    from hookwrap.torch import BestCheckpoint, Checkpoint, EarlyStopping

    class Scripted(Module):  # val_loss 3, 1, 2, 1.5: the best is the 2nd validation's
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", torch.tensor([3.0, 1.0, 2.0, 1.5][self.current_epoch]))

    with preset.weave(Scripted):
        module = Scripted(lr=0.1)
        every = Checkpoint(tmp_path / "ck", every_n_steps=3)
        best, early = BestCheckpoint(tmp_path / "best.pt", "val_loss", model=module), EarlyStopping("val_loss")
        for cb in (every, best, early):
            hw.add_callback(module, cb)
        theirs = ModelCheckpoint(tmp_path / "pl", filename="{step}", every_n_train_steps=3, save_top_k=-1)
        their_best = ModelCheckpoint(tmp_path / "pl-best", filename="{step}", monitor="val_loss")
        run = pl.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accumulate_grad_batches=accumulate,
                         callbacks=[theirs, their_best])
        run.fit(module, loader(), loader())
    assert run.global_step == 16 // accumulate
    steps = sorted(int(name[len("step="):-len(".ckpt")]) for name in os.listdir(tmp_path / "pl"))
    assert sorted(os.listdir(tmp_path / "ck")) == sorted(["last.pt"] + [f"step={s}.pt" for s in steps])
    assert their_best.best_model_path.endswith(f"step={best.best_step}.ckpt")
    assert early.best_step == best.best_step == 8 // accumulate and early.step == run.global_step


def test_grad_norm_is_the_unscaled_norm_under_lightning_16_mixed(hw, preset):
    """precision="16-mixed" (Lightning's GradScaler, here on the CPU): GradNorm after
    backward reads gradients still scaled, and reports the norm Lightning sees after it
    unscales them (on_before_optimizer_step), inf on the steps the scaler skips."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from hookwrap.torch import GradNorm

    class Half(Module):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x).float(), y)

        def on_before_optimizer_step(self, optimizer: Any) -> None:  # unscaled by now
            theirs.append(float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in self.parameters()]))))

    theirs: list[float] = []
    with preset.weave(Half):
        module = Half(lr=0.1)
        grads = GradNorm(model=module)
        hw.add_callback(module, grads)
        run = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))])
        run.fit(module, loader())
    assert len(theirs) == 8 and run.precision_plugin.scaler.get_scale() < 65536.0  # it scaled, and skipped
    assert [norm for _, norm in grads.history] == [pytest.approx(norm, rel=1e-3) for norm in theirs]


def test_skip_bad_steps_runs_lightnings_closure_then_skips_a_bad_update(hw, preset):
    """Lightning runs training_step and backward inside optimizer_step's closure:
    SkipBadSteps runs the closure first, judges its loss, and skips the update of
    the NaN batch (the third); the weights equal (torch.equal) those of Lightning's
    own run on the same batches without it, and Lightning's step count goes on."""
    from hookwrap.torch import SkipBadSteps

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
    bad_x = x.clone()
    bad_x[16, 0] = float("nan")  # in the third batch of 8
    keep = [i for i in range(32) if not 16 <= i < 24]

    def batches(inputs: Any, targets: Any) -> Any:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=8)

    with preset.weave(Module):
        module = Module(lr=0.1)
        skipping = SkipBadSteps()
        hw.add_callback(module, skipping)
        run = trainer(epochs=1)
        run.fit(module, batches(bad_x, y))
        assert skipping.skipped == [(3, "a loss is nan")] and run.global_step == 4  # counted, as an fp16 skip is
    reference = Module(lr=0.1)
    trainer(epochs=1).fit(reference, batches(x[keep], y[keep]))
    assert torch.isfinite(weights(module)).all()
    assert torch.equal(weights(module), weights(reference))


@pytest.mark.parametrize("lr, thresholds", [(0.02, dict(stopping_threshold=0.6)),
                                            (0.5, dict(divergence_threshold=1.9))])
def test_early_stopping_thresholds_stop_where_lightnings_do(hw, preset, lr, thresholds):
    """stopping_threshold (good enough) and divergence_threshold (hopeless), with a
    patience that would never stop these runs: the same epoch and global step as
    Lightning's EarlyStopping with the same settings."""
    from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping

    from hookwrap.torch import EarlyStopping

    theirs = fitted(hw, lr, 30, [LightningEarlyStopping("val_loss", patience=100, **thresholds)], [])
    with preset.weave(Module) as handle:
        ours = fitted(hw, lr, 30, [], [EarlyStopping("val_loss", patience=100, **thresholds)])
        assert "threshold" in str(handle.stopped)
    assert (ours.current_epoch, ours.global_step) == (theirs.current_epoch, theirs.global_step)
    assert 1 < theirs.current_epoch < 30


def test_checkpoint_every_n_minutes_saves_at_the_steps_lightnings_train_time_interval_does(hw, preset, tmp_path,
                                                                                          monkeypatch):
    """One clock for both, advanced 25 s by each training step: Checkpoint(every_n_minutes=1)
    saves after the same steps as ModelCheckpoint(train_time_interval=1 minute)."""
    import datetime
    import types

    import lightning.pytorch.callbacks.model_checkpoint as model_checkpoint
    from lightning.pytorch.callbacks import ModelCheckpoint

    import hookwrap.torch.checkpoint as checkpoint
    from hookwrap.torch import Checkpoint

    now = [1000.0]
    monkeypatch.setattr(model_checkpoint, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(checkpoint, "_clock", lambda: now[0])

    class Slow(Module):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            now[0] += 25.0
            return super().training_step(batch, batch_idx)

    def fit(callbacks: list[Any], hooked: list[Any]) -> None:
        now[0] = 1000.0
        module = Slow(lr=0.01)
        for cb in hooked:
            hw.add_callback(module, cb)
        pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=callbacks, default_root_dir=tmp_path).fit(module, loader())

    fit([ModelCheckpoint(tmp_path / "theirs", train_time_interval=datetime.timedelta(minutes=1), save_top_k=-1,
                         save_last=False)], [])
    theirs = sorted(int(p.stem.split("step=")[1]) for p in (tmp_path / "theirs").iterdir())
    with preset.weave(Slow):
        fit([], [Checkpoint(tmp_path / "ours", every_n_minutes=1, save_last=False)])
    ours = sorted(int(p.stem.split("=")[1]) for p in (tmp_path / "ours").glob("step=*.pt"))
    assert ours == theirs and len(theirs) >= 3, (ours, theirs)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_step_scheduler_gives_the_rates_of_lightnings_interval_step(hw, preset, accumulate):
    """A warm-up then cosine schedule: Lightning's own (``configure_optimizers`` with
    ``interval="step"``) against the same scheduler stepped by ``StepScheduler`` on
    the preset: each update is made with the same rate, accumulation on and off."""
    from hookwrap.torch import StepScheduler

    def schedule(optimizer: Any) -> Any:
        lr = torch.optim.lr_scheduler
        return lr.SequentialLR(optimizer, [lr.LinearLR(optimizer, 0.25, total_iters=2),
                                           lr.CosineAnnealingLR(optimizer, T_max=4)], milestones=[2])

    class Own(Module):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule(optimizer), "interval": "step"}}

    class Stepped(Module):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
            self.scheduler = schedule(optimizer)
            return optimizer

    def rates(cls: type, hooked: list[Any]) -> list[float]:
        module = cls(lr=0.1)
        seen: list[float] = []
        for cb in hooked:
            hw.add_callback(module, cb)
        # the rate each update is made with
        hw.before(module, "optimizer_step", lambda self: seen.append(self.optimizers().param_groups[0]["lr"]))
        run = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=accumulate)
        run.fit(module, loader())
        return seen

    with preset.weave(Module):
        lightnings = rates(Own, [])
        ours = rates(Stepped, [StepScheduler()])
    assert len(lightnings) == 12 // accumulate and len(set(lightnings)) > 3
    assert ours == pytest.approx(lightnings, rel=1e-12)


def test_rollback_on_lightning_goes_back_to_its_copy_and_past_the_bad_batch(hw, preset):
    """8 batches, a copy after updates 1 and 4 (every=3), a NaN in the 6th: the model
    and its optimizer (SGD with momentum) go back to update 4's state, and the run
    ends with the weights of Lightning's own run on batches 1-4 and 7-8, exactly
    (skipping the 6th alone would keep the 5th's update)."""
    from hookwrap.torch import Rollback

    class Momentum(Module):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
    bad_x = x.clone()
    bad_x[40, 0] = float("nan")  # in the 6th batch of 8
    keep = [i for i in range(64) if i < 32 or i >= 48]

    def batches(inputs: Any, targets: Any) -> Any:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=8)

    with preset.weave(Module):
        module = Momentum(lr=0.1)
        rollback = Rollback(every=3)
        hw.add_callback(module, rollback)
        trainer(epochs=1).fit(module, batches(bad_x, y))
        assert rollback.rolled_back == [(6, 4, "a loss is nan")]
    reference = Momentum(lr=0.1)
    trainer(epochs=1).fit(reference, batches(x[keep], y[keep]))
    assert torch.equal(weights(module), weights(reference))
