"""hookwrap.integrations.ignite on real ignite Engines: a linear model trained by
``create_supervised_trainer``, synthetic data, CPU."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.third_party

torch = pytest.importorskip("torch", reason="needs the torch extra")
engine_module = pytest.importorskip("ignite.engine", reason="needs the thirdparty extra (pytorch-ignite)")
Engine, Events = engine_module.Engine, engine_module.Events


def data() -> Any:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)  # 4 batches


def supervised(lr: float) -> tuple[Any, Any, Any]:
    from ignite.metrics import Loss

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    trainer = engine_module.create_supervised_trainer(model, optimizer, torch.nn.functional.mse_loss)
    evaluator = engine_module.create_supervised_evaluator(
        model, metrics={"val_loss": Loss(torch.nn.functional.mse_loss)})
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda engine: evaluator.run(data()))
    return model, trainer, evaluator


def fired(engine: Any, *events: Any) -> dict[Any, int]:
    counts = dict.fromkeys(events, 0)
    for event in events:
        engine.add_event_handler(event, lambda e, event=event: counts.__setitem__(event, counts[event] + 1))
    return counts


def test_early_stopping_on_the_evaluator_metrics_terminates(hw, preset):
    from hookwrap.torch import EarlyStopping, StepTimer

    with preset.weave() as handle:
        model, trainer, evaluator = supervised(lr=0.0)  # nothing is learned: val_loss stays put
        counts = fired(trainer, Events.TERMINATE, Events.COMPLETED)
        evaluations = []
        hw.after(trainer, "evaluate", lambda self, return_value: evaluations.append(return_value) or return_value)
        timer = StepTimer()
        hw.add_callback(trainer, EarlyStopping("val_loss", patience=2))
        hw.add_callback(trainer, timer)
        state = trainer.run(data(), max_epochs=20)
        assert state.epoch == 3 and state.iteration == 12  # epochs 1 (best), 2, 3 (patience spent)
        assert counts == {Events.TERMINATE: 1, Events.COMPLETED: 1}  # ignite's own end of run
        assert [sorted(m) for m in evaluations] == [["val_loss"]] * 3
        assert timer.count == 12 and isinstance(handle.stopped, hw.StopTraining)
        assert evaluator.state.metrics["val_loss"] == evaluations[-1]["val_loss"]


def test_the_update_function_is_the_step_join_point(hw, preset):
    from hookwrap.torch import NanGuard, NonFiniteError

    with preset.weave():
        outputs = []

        def update(engine: Any, batch: Any) -> float:
            return float(batch.sum())

        engine = Engine(update)
        hw.before(engine, "step", lambda self, batch: batch * 2)  # replaces the batch
        hw.after(engine, "step", lambda self, return_value: outputs.append(return_value) or return_value)
        state = engine.run([torch.ones(2)] * 3, max_epochs=2)
        assert outputs == [4.0] * 6 and state.output == 4.0
        assert Engine(update).run([torch.ones(2)], max_epochs=1).output == 2.0  # another engine: untouched

        poisoned = Engine(lambda engine, batch: float("nan") if engine.state.iteration == 3 else 1.0)
        hw.add_callback(poisoned, NanGuard(events="step"))  # a shipped callback on step
        with pytest.raises(NonFiniteError, match=r"'post-step' returned nan at step 3"):
            poisoned.run([0] * 4, max_epochs=2)


def test_stop_from_a_step_callback_terminates_after_that_iteration(hw, preset):
    with preset.weave():
        model, trainer, evaluator = supervised(lr=0.1)
        counts = fired(trainer, Events.ITERATION_COMPLETED, Events.COMPLETED)
        epochs = []
        hw.after(trainer, "epoch", lambda self: epochs.append(self.state.epoch))

        def stop_at_6(self, return_value):
            if self.state.iteration == 6:
                raise hw.StopTraining("six")
            return return_value

        hw.after(trainer, "step", stop_at_6)
        state = trainer.run(data(), max_epochs=10)
        assert state.iteration == 6 and counts == {Events.ITERATION_COMPLETED: 6, Events.COMPLETED: 1}
        assert epochs == [1, 2]  # the second epoch's event ends where the run terminated


def test_remove_restores_the_engine_class(hw, preset):
    before = dict(vars(Engine))

    def update(engine: Any, batch: Any) -> int:
        return batch

    old = Engine(update)  # made before weaving: its update function is found too
    handle = preset.weave()
    assert set(handle.events) == {"fit", "epoch", "step", "evaluate"}
    seen = []
    hw.after(old, "step", lambda self, return_value: seen.append(return_value) or return_value)
    old.run([1, 2], max_epochs=1)
    assert seen == [1, 2]
    handle.remove()
    assert dict(vars(Engine)) == before
    assert old._process_function is update and old.run([3], max_epochs=1).output == 3


def test_an_engine_made_while_woven_keeps_its_update_function_after_remove(hw, preset):
    def update(engine: Any, batch: Any) -> int:
        return batch * 2

    handle = preset.weave()
    engine = Engine(update)
    assert engine.run([1, 2], max_epochs=1).output == 4
    assert "_process_function" not in vars(engine)  # stored past it: ignite's self.<name> reads stay fast
    handle.remove()
    assert engine._process_function is update and engine.run([3], max_epochs=1).output == 6
    with pytest.raises(hw.HookError, match="expected an ignite Engine class"):
        preset.weave(dict)


@pytest.mark.parametrize("cumulative", [False, True])
def test_early_stopping_decides_as_ignite_early_stopping(hw, preset, cumulative):
    """The same run stopped by ignite's EarlyStopping handler and by hookwrap's, with the same
    patience and threshold: the same epoch. ignite's default (cumulative=False) moves its best
    on gains within the threshold, as hookwrap's default does on the preset (epoch 14);
    cumulative=True is small_gains_set_best=False, Lightning's reading (epoch 18)."""
    from ignite.handlers import EarlyStopping as IgniteEarlyStopping

    from hookwrap.torch import EarlyStopping

    _, trainer, evaluator = supervised(lr=0.01)
    evaluator.add_event_handler(Events.COMPLETED, IgniteEarlyStopping(
        patience=2, score_function=lambda e: e.state.metrics["val_loss"], trainer=trainer, threshold=0.01,
        cumulative=cumulative, mode="min"))
    ignite_stop = trainer.run(data(), max_epochs=60).epoch
    with preset.weave():
        _, trainer, _ = supervised(lr=0.01)
        hw.add_callback(trainer, EarlyStopping("val_loss", patience=2, min_delta=0.01,
                                               **({"small_gains_set_best": False} if cumulative else {})))
        assert trainer.run(data(), max_epochs=60).epoch == ignite_stop == (18 if cumulative else 14)


def test_resume_through_ignite_checkpoint_with_callback_state(hw, preset, tmp_path):
    """hw.CallbackState(trainer) in ignite's Checkpoint(to_save=...): saved with the trainer's
    state, loaded by Checkpoint.load_objects; the resumed run stops at the epoch the straight
    run stops at (3), where a fresh EarlyStopping would go on to 4."""
    from ignite.handlers import Checkpoint, DiskSaver

    from hookwrap.torch import EarlyStopping

    def run(epochs: int, resume: Any = None) -> tuple[Any, Any]:
        model, trainer, _ = supervised(lr=0.0)
        stopping = EarlyStopping("val_loss", patience=2)
        hw.add_callback(trainer, stopping)
        to_save = {"trainer": trainer, "model": model, "hookwrap": hw.CallbackState(trainer)}
        trainer.add_event_handler(Events.EPOCH_COMPLETED, Checkpoint(
            to_save, DiskSaver(tmp_path, require_empty=False), n_saved=None))
        if resume is not None:
            Checkpoint.load_objects(to_load=to_save, checkpoint=torch.load(resume, weights_only=False))
        return trainer.run(data(), max_epochs=epochs), stopping

    with preset.weave():
        straight, _ = run(20)
        for old in tmp_path.iterdir():
            old.unlink()
        first, stopping = run(2)
        assert first.epoch == 2 and stopping.wait == 1
        saved = sorted(tmp_path.iterdir(), key=lambda p: p.stat().st_mtime)[-1]  # after epoch 2
        resumed, stopping = run(20, resume=saved)
        assert resumed.epoch == straight.epoch == 3 and stopping.wait == 2


def test_checkpoint_resume_is_refused_naming_ignites_own(hw, preset, tmp_path):
    """ignite keeps the run's position in engine.state: Checkpoint's resume would put
    the weights back under a run that starts again at iteration 0, silently. Refused
    where it is set up, naming ignite's Checkpoint; saving weights still works."""
    import signal

    from hookwrap.torch import Checkpoint

    with preset.weave():
        model, trainer, _ = supervised(lr=0.1)
        for settings in ({"on_exception": True}, {"on_signal": signal.SIGTERM}, {"resume_from": "last"}):
            with pytest.raises(hw.HookError, match=r"resumes it itself.*Checkpoint\.load_objects"):
                hw.add_callback(trainer, Checkpoint(tmp_path / "refused", **settings))
        saving = Checkpoint(tmp_path / "ckpt", every_n_steps=4, model=model, optimizer=None)
        hw.add_callback(trainer, saving)
        trainer.run(data(), max_epochs=2)
        assert (tmp_path / "ckpt" / "step=8.pt").exists() and (tmp_path / "ckpt" / "last.pt").exists()
        with pytest.raises(hw.HookError, match="CallbackState"):
            saving.resume(trainer, "last")
