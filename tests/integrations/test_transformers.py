"""hookwrap.integrations.transformers on a real HF Trainer: a tiny GPT-2 built from
a config, synthetic tokens, CPU. The shipped callbacks run with their default events."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

pytestmark = pytest.mark.third_party

torch = pytest.importorskip("torch", reason="needs the torch extra")
hf = pytest.importorskip("transformers", reason="needs the thirdparty extra (transformers)")

from tests.integrations._tiny_hf import tiny_trainer  # noqa: E402 (needs transformers)


def weights(trainer: Any) -> Any:
    return torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])


def test_loss_is_scaled_in_training_only(hw, preset, tmp_path):
    with preset.weave():
        trainer = tiny_trainer(tmp_path, steps=3)
        unscaled = trainer.evaluate()["eval_loss"]
        seen = []

        def zero(self, return_value):  # a loss scaled to zero: nothing is learned
            seen.append(float(return_value.detach()))
            return return_value * 0.0

        hw.after(trainer, "loss", zero)
        before = weights(trainer)
        out = trainer.train()
        assert torch.equal(weights(trainer), before)
        assert out.global_step == 3 and len(seen) == 3 and all(v > 0 for v in seen)
        assert out.training_loss == 0.0  # training_step returned the scaled loss
        metrics = trainer.evaluate()  # compute_loss runs in prediction_step: no callback there
        assert len(seen) == 3 and metrics["eval_loss"] == pytest.approx(unscaled) and unscaled > 1


@pytest.mark.parametrize("sync", [True, False])
def test_nan_guard_stops_on_a_nan_loss(hw, preset, tmp_path, sync):
    from hookwrap.torch import NanGuard, NonFiniteError

    with preset.weave():
        trainer = tiny_trainer(tmp_path, steps=6)
        calls = []

        def poison(self, return_value):
            calls.append(1)
            return return_value * float("nan") if len(calls) == 3 else return_value

        hw.after(trainer, "loss", poison)
        hw.add_callback(trainer, NanGuard(sync=sync))  # default events: loss, counted by step
        with pytest.raises(NonFiniteError, match=r"'post-loss' returned nan at step 3"):
            trainer.train()
        # sync=True: in the bad step; by default read back when the run (6 steps) ends.
        assert len(calls) == (3 if sync else 6)


def test_early_stopping_ends_train_normally(hw, preset, tmp_path):
    from hookwrap.torch import EarlyStopping, GradNorm, LRMonitor, StepTimer

    with preset.weave() as handle:
        trainer = tiny_trainer(tmp_path, steps=20, evaluate_every=1)
        stopper = EarlyStopping("eval_loss", patience=2, min_delta=100.0)  # never improves enough
        timer, grads, lrs = StepTimer(), GradNorm(), LRMonitor()
        for cb in (stopper, timer, grads, lrs):
            hw.add_callback(trainer, cb)
        out = trainer.train()
        assert isinstance(out, hf.trainer_utils.TrainOutput)
        assert out.global_step == 3 < 20  # evaluations 1 (best), 2, 3 (patience 2 spent)
        assert "train_loss" in out.metrics and "train_loss" in trainer.state.log_history[-1]  # end of run ran
        assert isinstance(handle.stopped, hw.StopTraining) and "eval_loss" in str(handle.stopped)
        assert timer.count == 3 and len(grads.history) == 3 and all(n > 0 for _, n in grads.history)
        assert lrs.history[0] == (1, [pytest.approx(1e-2)] * 2)  # two param groups (decay / no decay)


def test_best_checkpoint_restores_the_best_weights(hw, preset, tmp_path):
    from hookwrap.torch import BestCheckpoint

    with preset.weave():
        trainer = tiny_trainer(tmp_path, steps=4, evaluate_every=1)
        scores = iter([1.0, 0.5, 2.0, 3.0])  # the best evaluation is the second, after 2 updates
        hw.after(trainer, "evaluate", lambda self, return_value: {**return_value, "eval_loss": next(scores)})
        updated = {}  # weights after n optimizer updates

        def record(self):
            updated[self.state.global_step] = weights(self)

        hw.before(trainer, "step", record)
        hw.after(trainer, "fit", lambda self, return_value: record(self) or return_value)  # before the restore
        best = BestCheckpoint(tmp_path / "best.pt", monitor="eval_loss", restore_best=True)
        hw.add_callback(trainer, best)
        trainer.train()
        assert best.saved == 2 and best.best.value == 0.5 and best.best_step == 2
        assert torch.load(tmp_path / "best.pt", weights_only=True)["value"] == 0.5
        assert not torch.equal(updated[4], updated[2])
        assert torch.equal(weights(trainer), updated[2])  # restored after fit


def test_stop_from_a_step_callback_finishes_that_step(hw, preset, tmp_path):
    with preset.weave():
        trainer = tiny_trainer(tmp_path, steps=10)

        def stop_at_3(self):
            if self.state.global_step >= 2:
                raise hw.StopTraining("enough")

        hw.before(trainer, "step", stop_at_3)  # before step 3: the step still runs, then train() ends
        out = trainer.train()
        assert out.global_step == 3
        with pytest.raises(hw.StopTraining):  # outside train() there is no run to stop
            trainer.training_step(trainer.model, {k: v[None] for k, v in trainer.train_dataset[0].items()})


def test_remove_restores_every_attribute(hw, preset, tmp_path):
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    def snapshot() -> Any:
        return [dict(vars(c)) for c in (hf.Trainer, Accelerator, AcceleratedOptimizer)]

    before = snapshot()
    handle = preset.weave()
    assert set(handle.events) == {"fit", "epoch", "step", "loss", "backward", "optimizer_step", "evaluate", "log"}
    assert snapshot() != before
    handle.remove()
    handle.remove()  # idempotent
    assert snapshot() == before
    trainer = tiny_trainer(tmp_path, steps=2)
    with pytest.raises(hw.UnknownEventError):
        hw.after(trainer, "loss", lambda self: None)


def test_a_subclass_is_woven_and_bad_input_refused(hw, preset, tmp_path):
    class MyTrainer(hf.Trainer):
        def compute_loss(self, model, inputs, **kwargs):
            return super().compute_loss(model, inputs, **kwargs) * 2

    with preset.weave(MyTrainer):
        trainer = tiny_trainer(tmp_path, steps=2, cls=MyTrainer)
        losses = []
        hw.after(trainer, "loss", lambda self, return_value: losses.append(float(return_value.detach())) or return_value)
        trainer.train()
        assert len(losses) == 2 and losses[0] > 7  # the override's doubled loss (~2 * ln 64)
    assert "compute_loss" in vars(MyTrainer) and "train" not in vars(MyTrainer)
    with pytest.raises(hw.HookError, match=r"expected a transformers Trainer class .* got <class 'int'>"):
        preset.weave(int)
    with preset.weave():
        with pytest.raises(hw.HookError, match="already"):
            preset.weave()


def test_every_shipped_callback_attaches_with_its_default_events(hw, preset, tmp_path):
    import io

    from hookwrap.torch import (BestCheckpoint, EarlyStopping, GradNorm, LRMonitor, MetricsLogger, NanGuard,
                                ProgressBar, StepTimer)

    with preset.weave():
        trainer = tiny_trainer(tmp_path, steps=4, evaluate_every=2, logging_strategy="steps", logging_steps=1)
        log = MetricsLogger(tmp_path / "metrics.csv", tensorboard=False)  # logs what HF logs: every step
        bar = io.StringIO()
        for cb in (ProgressBar(file=bar), log, StepTimer(), NanGuard(), GradNorm(logger=log), LRMonitor(logger=log),
                   EarlyStopping("eval_loss", patience=5), BestCheckpoint(tmp_path / "best.pt", monitor="eval_loss")):
            hw.add_callback(trainer, cb)
        trainer.train()
        rows = log.read()
        names = [name for _, name, _ in rows]
        assert names.count("loss") == 4 and names.count("eval_loss") == 2
        assert names.count("grad_norm") == 8  # HF logs its own, beside GradNorm's
        assert [step for step, name, _ in rows if name == "loss"] == [1, 2, 3, 4]
        assert "epoch 1" in bar.getvalue() and (tmp_path / "best.pt").exists()


@pytest.mark.parametrize("first_removed", ["accelerate", "transformers"])
@pytest.mark.parametrize("first_woven", ["accelerate", "transformers"])
def test_two_presets_routing_the_same_method_remove_in_any_order(hw, preset, tmp_path, first_woven, first_removed):
    # Both presets patch Accelerator.backward and AcceleratedOptimizer.step. Removing
    # the one woven first used to put its saved attribute back over the other's
    # router (whose events then stopped), and the other's remove() then put the
    # first one's wrapper back.
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    accelerate_preset = importlib.import_module("hookwrap.integrations.accelerate")

    def snapshot() -> Any:
        return [dict(vars(c)) for c in (hf.Trainer, Accelerator, AcceleratedOptimizer)]

    before = snapshot()
    weaves = {"accelerate": accelerate_preset.weave, "transformers": preset.weave}
    handles = {name: weaves[name]() for name in sorted(weaves, key=lambda name: name != first_woven)}
    try:
        trainer = tiny_trainer(tmp_path, steps=2)
        counts = {"backward": 0, "optimizer_step": 0, "accelerator": 0}

        def count(event: str) -> Any:
            def callback(self: Any) -> None:
                counts[event] += 1
            return callback

        hw.after(trainer, "backward", count("backward"))
        hw.after(trainer, "optimizer_step", count("optimizer_step"))
        hw.after(trainer.accelerator, "backward", count("accelerator"))
        trainer.train()
        assert counts == {"backward": 2, "optimizer_step": 2, "accelerator": 2}
        handles.pop(first_removed).remove()
        counts = dict.fromkeys(counts, 0)
        trainer.train()
        if first_removed == "accelerate":  # the trainer's events still fire
            assert counts == {"backward": 2, "optimizer_step": 2, "accelerator": 0}
            with pytest.raises(hw.UnknownEventError):
                hw.before(trainer.accelerator, "backward", lambda self: None)
        else:  # the accelerator's events still fire
            assert counts == {"backward": 0, "optimizer_step": 0, "accelerator": 2}
            with pytest.raises(hw.UnknownEventError):
                hw.before(trainer, "backward", lambda self: None)
    finally:
        for handle in handles.values():
            handle.remove()
    assert snapshot() == before


@pytest.mark.parametrize("logging_steps", [1, 2])
def test_metrics_logger_logs_what_hf_logs_under_accumulation(hw, preset, tmp_path, logging_steps):
    """gradient_accumulation_steps=4: one loss per optimizer step (the micro-batches' shares
    added), at global_step, every logging_steps updates, and the evaluations: the rows of
    HF's own log_history, value for value."""
    from hookwrap.torch import MetricsLogger

    with preset.weave():
        trainer = tiny_trainer(tmp_path, steps=4, evaluate_every=2, gradient_accumulation_steps=4,
                               logging_strategy="steps", logging_steps=logging_steps)
        logger = MetricsLogger(tmp_path / "m.csv", tensorboard=False)
        hw.add_callback(trainer, logger)
        updates, micro_batches = [], []
        hw.after(trainer, "optimizer_step", lambda self: updates.append(1))
        hw.after(trainer, "step", lambda self: micro_batches.append(1))
        trainer.train()
        rows = logger.read()
    assert len(updates) == trainer.state.global_step == 4 and len(micro_batches) == 16
    expected = [(row["step"], name, float(value)) for row in trainer.state.log_history
                for name, value in row.items() if name != "step"]
    assert rows == [(step, name, pytest.approx(value)) for step, name, value in expected]
    losses = [(step, value) for step, name, value in rows if name == "loss"]
    assert [step for step, _ in losses] == list(range(logging_steps, 5, logging_steps))
    assert any(name == "eval_loss" for _, name, _ in rows)


@pytest.mark.parametrize("threshold", [0.01, 0.03])
def test_early_stopping_decides_as_hf_early_stopping_callback(hw, preset, tmp_path, threshold):
    """The same run, stopped by HF's EarlyStoppingCallback and by hookwrap's EarlyStopping with
    the same patience and threshold: the same stop step with EarlyStopping's default on the
    preset (HF's reading). The eval loss falls by ~0.007 per evaluation: within 0.01, HF
    moves its best and stops at 3 where Lightning's reading (small_gains_set_best=False)
    waits for a gain of 0.01 (step 13)."""
    from hookwrap.torch import EarlyStopping

    def run(*callbacks: Any, hf_callback: Any = None) -> int:
        trainer = tiny_trainer(tmp_path, steps=40, evaluate_every=1, learning_rate=3e-3,
                               metric_for_best_model="eval_loss" if hf_callback else None)
        if hf_callback:
            trainer.add_callback(hf_callback)
        for cb in callbacks:
            hw.add_callback(trainer, cb)
        trainer.train()
        return int(trainer.state.global_step)

    hf_stop = run(hf_callback=hf.EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=threshold))
    with preset.weave():
        stopping = EarlyStopping("eval_loss", patience=2, min_delta=threshold)
        assert run(stopping) == hf_stop < 40 and stopping.small_gains_set_best
        with EarlyStopping("eval_loss", patience=2, min_delta=threshold):  # the global tier: HF's reading too
            assert run() == hf_stop
        lightning_reading = run(EarlyStopping("eval_loss", patience=2, min_delta=threshold, small_gains_set_best=False))
    assert (lightning_reading > hf_stop) == (threshold == 0.01)


def test_resume_from_hf_checkpoint_restores_hookwrap_callbacks(hw, preset, tmp_path):
    """HF's own checkpoint folder carries the callbacks' state, and
    train(resume_from_checkpoint=True) restores it: the resumed run stops at the step the
    straight run stops at (without it, EarlyStopping's count starts over: step 5)."""
    from hookwrap.torch import EarlyStopping

    def trainer(steps: int, folder: str) -> Any:
        trainer = tiny_trainer(tmp_path / folder, steps=steps, evaluate_every=1, lr_scheduler_type="constant",
                               save_strategy="steps", save_steps=1)
        stopping = EarlyStopping("eval_loss", patience=2, min_delta=100.0)  # never improves enough
        hw.add_callback(trainer, stopping)
        return trainer, stopping

    with preset.weave():
        straight, _ = trainer(40, "straight")
        straight.train()
        first, stopping = trainer(2, "resumed")
        first.train()
        assert stopping.wait == 1 and (tmp_path / "resumed" / "checkpoint-2" / preset.STATE_FILE).is_file()
        resumed, stopping = trainer(40, "resumed")
        resumed.train(resume_from_checkpoint=True)
        assert resumed.state.global_step == straight.state.global_step == 3
        assert stopping.wait == 2


def test_grad_accumulation_is_refused_naming_hf_own(hw, preset, tmp_path):
    from hookwrap.torch import GradAccumulation

    with preset.weave():
        trainer = tiny_trainer(tmp_path, gradient_accumulation_steps=2)
        with pytest.raises(hw.HookError, match=r"accumulates gradients itself.*gradient_accumulation_steps=N"):
            hw.add_callback(trainer, GradAccumulation(2))
        with pytest.raises(hw.HookError, match=r"accumulates gradients itself.*gradient_accumulation_steps=N"):
            hw.register_global_callback(GradAccumulation(2))  # the global tier, as hookwrap run registers
    assert not hasattr(hf.Trainer, "__hookwrap_accumulation__")  # removed with the preset


def test_checkpoint_resume_is_refused_naming_the_trainers_own(hw, preset, tmp_path):
    """The Trainer keeps the run's position (state.global_step, its loop):
    Checkpoint's resume would put the weights back and train again from step 0,
    silently. Refused where it is set up, naming resume_from_checkpoint."""
    from hookwrap.torch import Checkpoint

    with preset.weave():
        trainer = tiny_trainer(tmp_path)
        for settings in ({"on_exception": True}, {"resume_from": "last"}):
            with pytest.raises(hw.HookError, match=r"resumes it itself.*resume_from_checkpoint"):
                hw.add_callback(trainer, Checkpoint(tmp_path / "refused", **settings))
        with pytest.raises(hw.HookError, match="resume_from_checkpoint"):
            Checkpoint(tmp_path / "ckpt").resume(trainer, "last")


def test_a_crafted_state_file_runs_no_code_on_resume(hw, preset, tmp_path):
    """The folder train(resume_from_checkpoint=...) reads is data, not code: a
    hookwrap_callbacks.pt whose pickle opens a file is refused, naming it, before anything runs."""
    from hookwrap.torch import EarlyStopping
    from tests.torch._crafted import OpensAFile

    marker = tmp_path / "marker"
    with preset.weave():
        first = tiny_trainer(tmp_path / "run", steps=2, evaluate_every=1, save_strategy="steps", save_steps=2)
        hw.add_callback(first, EarlyStopping("eval_loss", patience=2))
        first.train()
        state_file = tmp_path / "run" / "checkpoint-2" / preset.STATE_FILE
        assert torch.load(state_file, weights_only=True)  # what hookwrap writes is plain data
        torch.save({"EarlyStopping[monitor=eval_loss,mode=min]": OpensAFile(marker)}, state_file)
        resumed = tiny_trainer(tmp_path / "run", steps=4, evaluate_every=1, save_strategy="steps", save_steps=2)
        hw.add_callback(resumed, EarlyStopping("eval_loss", patience=2))
        with pytest.raises(hw.HookError, match=r"hookwrap_callbacks\.pt.*holds more than tensors and plain data"):
            resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert not marker.exists()


@pytest.mark.parametrize("accumulate", [1, 4])
def test_callbacks_number_steps_in_hf_updates(hw, preset, tmp_path, accumulate):
    """A step is what HF counts (state.global_step: optimizer updates), with accumulation on
    and off: Checkpoint's file names, EarlyStopping's and BestCheckpoint's best step (HF's
    best_global_step), their saved step, and GradNorm's norms (one per update: HF's
    grad_norm, the accumulated gradients' norm before clipping)."""
    import os

    from hookwrap.torch import BestCheckpoint, Checkpoint, EarlyStopping, GradNorm, MetricsLogger

    with preset.weave():
        trainer = tiny_trainer(tmp_path / "hf", steps=8, evaluate_every=2, gradient_accumulation_steps=accumulate,
                               logging_strategy="steps", logging_steps=1, metric_for_best_model="eval_loss",
                               save_strategy="steps", save_steps=2)
        scripted = iter([3.0, 1.0, 2.0, 1.5])  # the best at the 2nd evaluation: update 4

        def evaluated(self, return_value):  # what HF decides on too: the metrics evaluate returns
            return {**return_value, "eval_loss": next(scripted)}

        hw.after(trainer, "evaluate", evaluated)
        every = Checkpoint(tmp_path / "ck", every_n_steps=3)
        early, best = EarlyStopping("eval_loss", patience=100), BestCheckpoint(tmp_path / "best.pt", "eval_loss")
        log = MetricsLogger(tmp_path / "m.csv", tensorboard=False)
        grads = GradNorm(logger=log)
        for cb in (every, early, best, log, grads):
            hw.add_callback(trainer, cb)
        trainer.train()
    state = trainer.state
    assert state.global_step == 8
    assert sorted(os.listdir(tmp_path / "ck")) == ["last.pt", "step=3.pt", "step=6.pt"]
    assert torch.load(tmp_path / "ck" / "step=6.pt", weights_only=True)["step"] == 6
    assert early.best_step == best.best_step == state.best_global_step == 4 and early.step == best.step == 8
    assert state.best_model_checkpoint.endswith("checkpoint-4")
    assert early.state_dict()["step_axis"] == "updates"
    hf_norms = [(row["step"], row["grad_norm"]) for row in state.log_history if "grad_norm" in row]
    assert len(hf_norms) == 8 and grads.history == [(step, pytest.approx(norm, rel=1e-5)) for step, norm in hf_norms]
    # One step axis in the CSV: HF's rows and GradNorm's, all at HF's steps.
    assert {step for step, _, _ in log.read()} == set(range(1, 9))


@pytest.mark.parametrize("accumulate", [1, 4])
def test_nan_guard_names_the_hf_update(hw, preset, tmp_path, accumulate):
    from hookwrap.torch import NanGuard, NonFiniteError

    with preset.weave():
        trainer = tiny_trainer(tmp_path, steps=6, gradient_accumulation_steps=accumulate)
        calls = []

        def poison(self, return_value):  # the first batch of update 3
            calls.append(1)
            return return_value * float("nan") if len(calls) == 2 * accumulate + 1 else return_value

        hw.after(trainer, "loss", poison)
        hw.add_callback(trainer, NanGuard(sync=True))
        with pytest.raises(NonFiniteError, match=r"'post-loss' returned nan at step 3\b"):
            trainer.train()


def test_a_resumed_hf_run_numbers_on_from_hf_step(hw, preset, tmp_path):
    """trainer.train(resume_from_checkpoint=...) from update 4 of 8, accumulating 2: the
    callbacks restored from the checkpoint count on from HF's global_step, and one attached
    afresh (no state of its own) numbers its files as HF numbers its updates."""
    import os

    from hookwrap.torch import Checkpoint, EarlyStopping

    arguments = dict(steps=8, evaluate_every=2, gradient_accumulation_steps=2, save_strategy="steps", save_steps=4)
    with preset.weave():
        trainer = tiny_trainer(tmp_path / "run", **arguments)
        straight = EarlyStopping("eval_loss", patience=100)
        hw.add_callback(trainer, straight)
        trainer.train()
        resumed = tiny_trainer(tmp_path / "run", **arguments)
        early, every = EarlyStopping("eval_loss", patience=100), Checkpoint(tmp_path / "ck", every_n_steps=3)
        hw.add_callback(resumed, early)
        hw.add_callback(resumed, every)
        with pytest.warns(UserWarning, match="had no saved state and start afresh"):
            resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-4"))
    assert resumed.state.global_step == 8
    assert early.state_dict() == straight.state_dict() and early.step == 8
    assert sorted(os.listdir(tmp_path / "ck")) == ["last.pt", "step=6.pt"]


def test_skip_bad_steps_skips_the_update_of_a_bad_batch_as_if_it_never_came(hw, preset, tmp_path):
    """A NaN loss at HF's update 3 (batches in order): SkipBadSteps skips that update and
    HF goes on, its LR scheduler (a warm-up) not stepped for it; the weights after 6
    updates equal (torch.equal) those of HF's own run of 5 updates on the same batches
    without that one. Without it, the NaN reaches the weights."""
    from hookwrap.torch import SkipBadSteps

    class InOrder(hf.Trainer):
        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            return torch.utils.data.SequentialSampler(train_dataset or self.train_dataset)

    # A warm-up over 4 scheduler steps: a skipped update that stepped HF's scheduler
    # would make every later update with another rate (HF steps it only for updates made).
    settings = dict(cls=InOrder, lr_scheduler_type="constant_with_warmup", warmup_steps=4,
                    dataloader_drop_last=True)

    def made(folder: str, steps: int) -> Any:
        trainer = tiny_trainer(tmp_path / folder, steps=steps, **settings)
        for module in trainer.model.modules():  # no dropout: a skipped batch draws no random numbers
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        return trainer

    def poisoned(steps: int, skip: bool) -> Any:
        trainer = made(f"run{skip}", steps)
        calls: list[int] = []

        def poison(self: Any, return_value: Any) -> Any:
            calls.append(1)
            return return_value * float("nan") if len(calls) == 3 else return_value

        hw.after(trainer, "loss", poison)
        skipping = SkipBadSteps()
        if skip:
            hw.add_callback(trainer, skipping)
        trainer.train()
        return trainer, skipping

    with preset.weave():
        trainer, skipping = poisoned(6, skip=True)
        assert skipping.skipped == [(3, "a loss is nan")] and trainer.state.global_step == 6
        assert torch.isfinite(weights(trainer)).all()
        unskipped, _ = poisoned(6, skip=False)
        assert not torch.isfinite(weights(unskipped)).all()

    # HF alone, the third batch (samples 8-11) left out of the data.
    reference = made("reference", 5)
    dataset = reference.train_dataset
    reference.train_dataset = torch.utils.data.Subset(dataset, [i for i in range(len(dataset)) if not 8 <= i < 12])
    reference.train()
    assert torch.equal(weights(trainer), weights(reference))


def test_evaluate_first_gives_hfs_eval_on_start(hw, preset, tmp_path):
    """EvaluateFirst on the preset against HF's own ``eval_on_start=True`` on the same
    run: the same evaluations in ``log_history`` (the first at step 0, before any
    update), the same eval_loss values."""
    from hookwrap.torch import EvaluateFirst

    def evaluations(trainer: Any) -> list[tuple[int, float]]:
        return [(row["step"], row["eval_loss"]) for row in trainer.state.log_history if "eval_loss" in row]

    theirs = tiny_trainer(tmp_path / "theirs", steps=4, evaluate_every=2, eval_on_start=True)
    theirs.train()
    with preset.weave():
        ours = tiny_trainer(tmp_path / "ours", steps=4, evaluate_every=2)
        first = EvaluateFirst()
        hw.add_callback(ours, first)
        ours.train()
    assert evaluations(theirs)[0][0] == 0 and len(evaluations(theirs)) == 3
    assert [step for step, _ in evaluations(ours)] == [step for step, _ in evaluations(theirs)]
    assert [loss for _, loss in evaluations(ours)] == pytest.approx([loss for _, loss in evaluations(theirs)],
                                                                    rel=1e-6)
    assert first.evaluations == 1


def test_best_checkpoint_to_safetensors_is_what_from_pretrained_loads(hw, preset, tmp_path):
    """``BestCheckpoint("best/model.safetensors")`` on HF's Trainer: the best weights,
    restored at the end, are what ``from_pretrained`` loads from that folder (beside
    the model's config.json), tied weights included; the file holds tensors and its
    metadata alone. An optimizer to save there is refused."""
    import safetensors
    from hookwrap.torch import BestCheckpoint

    with preset.weave():
        trainer = tiny_trainer(tmp_path / "run", steps=4, evaluate_every=2)
        best = BestCheckpoint(tmp_path / "best" / "model.safetensors", monitor="eval_loss", restore_best=True)
        hw.add_callback(trainer, best)
        trainer.train()
    assert best.saved >= 1
    trainer.model.config.save_pretrained(tmp_path / "best")
    loaded = hf.GPT2LMHeadModel.from_pretrained(tmp_path / "best")
    ours, theirs = trainer.model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k].cpu(), theirs[k]) for k in ours)
    with safetensors.safe_open(str(tmp_path / "best" / "model.safetensors"), "pt") as f:
        assert f.metadata()["monitor"] == "eval_loss" and float(f.metadata()["value"]) == best.best.value
    with pytest.raises(hw.SettingError, match=r"holds the weights alone.*optimizer=None"):
        BestCheckpoint(tmp_path / "x.safetensors", optimizer=torch.optim.SGD(trainer.model.parameters(), lr=0.1))
