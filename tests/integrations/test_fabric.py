"""hookwrap.integrations.fabric: a user-written loop on a real Lightning ``Fabric``
(CPU, one device), a linear model, synthetic data; what hookwrap's callbacks see and
decide is compared with what Fabric (its own callbacks, its CSVLogger) and Lightning
(its EarlyStopping's criterion) see and decide on the same run."""

from __future__ import annotations

import contextlib
import csv
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.third_party

torch = pytest.importorskip("torch", reason="needs the torch extra")
fabric_module = pytest.importorskip("lightning.fabric", reason="needs the thirdparty extra (lightning)")
Fabric = fabric_module.Fabric

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "fabric_style.py"
BATCHES = 8  # an epoch
# The validation loss of each epoch, as the loop computes it below for EarlyStopping:
# best at epoch 2, then worse for 2 evaluations (patience=2 stops at epoch 4).
VAL = [1.0, 0.8, 0.9, 0.85, 0.7, 0.6, 0.5, 0.4]


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="lightning")  # its advice on workers and devices
        yield


def made(callbacks: Any = None, loggers: Any = None, lr: float = 0.1) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    fabric = Fabric(accelerator="cpu", devices=1, callbacks=callbacks, loggers=loggers)
    layer = torch.nn.Linear(4, 1)
    model, optimizer = fabric.setup(layer, torch.optim.SGD(layer.parameters(), lr=lr))
    return fabric, model, optimizer


def batch(epoch: int, i: int) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(epoch * 100 + i)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


def train(fabric: Any, model: Any, optimizer: Any, epochs: int, *, accumulate: int = 1, first_epoch: int = 0,
          log: bool = False, save: Any = None, check: Any = None) -> int:
    """The user's loop, as Fabric's docs write it (gradient accumulation with
    no_backward_sync); returns the epochs it completed."""
    step = first_epoch * BATCHES
    for epoch in range(first_epoch, epochs):
        for i in range(BATCHES):
            x, y = batch(epoch, i)
            update = (i + 1) % accumulate == 0
            with fabric.no_backward_sync(model, enabled=not update):
                loss = torch.nn.functional.mse_loss(model(x), y)
                fabric.backward(loss / accumulate)
            if update:
                optimizer.step()
                optimizer.zero_grad()
            step += 1
            if log:
                fabric.log("loss", loss, step=step)
            fabric.call("on_train_batch_end", loss=loss)
        if log:
            fabric.log("val_loss", VAL[epoch], step=step)
        fabric.call("on_validation_end", val_loss=VAL[epoch])
        if save is not None:
            fabric.save(save, {"model": model, "optimizer": optimizer, "epoch": epoch})
        if check is not None and check(fabric):
            return epoch + 1
    return epochs


def weights(model: Any) -> Any:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


class FabricCounter:
    """A plain Fabric callback: what Fabric itself calls."""

    def __init__(self) -> None:
        self.updates = 0
        self.validations: list[float] = []
        self.setups = 0

    def on_after_optimizer_step(self, strategy: Any, optimizer: Any) -> None:
        self.updates += 1

    def on_validation_end(self, val_loss: float) -> None:
        self.validations.append(val_loss)

    def on_after_setup(self, fabric: Any, module: Any) -> None:
        self.setups += 1


def lightning_stops_at(patience: int) -> int:
    """The evaluation (1-based) at which Lightning's own EarlyStopping says stop, on VAL."""
    from lightning.pytorch.callbacks import EarlyStopping

    early = EarlyStopping("val_loss", patience=patience)
    for n, value in enumerate(VAL, 1):
        if early._evaluate_stopping_criteria(torch.tensor(value))[0]:
            return n
    return len(VAL)


def test_optimizer_steps_are_updates_with_gradient_accumulation(hw, preset):
    with preset.weave() as handle:
        counter = FabricCounter()
        fabric, model, optimizer = made(callbacks=[counter])
        counts = {"backward": 0, "optimizer_step": 0, "step": 0, "loss": 0}
        for event in counts:
            hw.after(fabric, event, lambda self, event=event: counts.__setitem__(event, counts[event] + 1))
        train(fabric, model, optimizer, epochs=2, accumulate=4)
        assert counts == {"backward": 16, "optimizer_step": 4, "step": 16, "loss": 16}
        assert counter.updates == 4 and counter.setups == 1  # Fabric's own hook: the same updates
        assert set(handle.events) == {"backward", "optimizer_step", "step", "loss", "evaluate"}
        woven = weights(model)
    fabric, model, optimizer = made()  # unwoven: the same numbers
    train(fabric, model, optimizer, epochs=2, accumulate=4)
    assert torch.equal(weights(model), woven)


@pytest.mark.parametrize("accumulate", [1, 4])
def test_callbacks_count_the_updates_fabric_runs(hw, preset, accumulate):
    """A step is an update (Fabric's on_after_optimizer_step): EarlyStopping's step and
    saved state, and one loss row per update, the mean of its batches' losses, at its step."""
    from hookwrap.torch import EarlyStopping, MetricsLogger

    class Sink:
        def __init__(self) -> None:
            self.rows: list[tuple[int, dict[str, float]]] = []

        def log_metrics(self, metrics: dict[str, float], step: int) -> None:
            self.rows.append((step, dict(metrics)))

    batch_losses: list[float] = []
    with preset.weave():
        counter, sink = FabricCounter(), Sink()
        early = EarlyStopping("val_loss", patience=100)
        fabric, model, optimizer = made(callbacks=[counter, early, MetricsLogger(loggers=[sink], flush_secs=None)])
        hw.after(fabric, "loss", lambda self, return_value: batch_losses.append(float(return_value.detach())) or return_value)
        train(fabric, model, optimizer, epochs=2, accumulate=accumulate)
        fabric.call("on_train_end")
    updates = 2 * BATCHES // accumulate
    assert counter.updates == updates and early.step == updates and early.state_dict()["step_axis"] == "updates"
    assert early.best_step == updates  # VAL[1] = 0.8 after epoch 2, its last update
    losses = [(step, metrics["loss"]) for step, metrics in sink.rows if "loss" in metrics]
    means = [sum(batch_losses[i:i + accumulate]) / accumulate for i in range(0, len(batch_losses), accumulate)]
    assert losses == [(step, pytest.approx(mean)) for step, mean in zip(range(1, updates + 1), means)]
    assert [step for step, metrics in sink.rows if "val_loss" in metrics] == [updates // 2, updates]


def test_backward_reads_the_loss_and_optimizer_step_is_routed_to_its_fabric(hw, preset):
    from hookwrap.torch import GradNorm, LRMonitor

    with preset.weave():
        fabric, model, optimizer = made(lr=0.1)
        hw.before(fabric, "backward", lambda self, loss: loss * 0.0)  # nothing is learned
        grads, lrs = GradNorm(model=model), LRMonitor(optimizer=optimizer)
        hw.add_callback(fabric, grads)
        hw.add_callback(fabric, lrs)
        before = weights(model)
        train(fabric, model, optimizer, epochs=1)
        assert torch.equal(weights(model), before)
        assert [n for _, n in grads.history] == [0.0] * BATCHES and lrs.history == [(1, [pytest.approx(0.1)])]  # update 1
        steps: list[int] = []
        hw.after(fabric, "optimizer_step", lambda self: steps.append(1))
        other, other_model, other_optimizer = made()  # another fabric's optimizer: its own events
        other_optimizer.step()
        optimizer_only = fabric.setup_optimizers(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1))
        optimizer_only.step()
        optimizer.step()
        assert len(steps) == 2


def test_metrics_logger_and_early_stopping_match_fabric_and_lightning(hw, preset, tmp_path):
    # The loop logs through fabric.log to one CSVLogger; MetricsLogger, attached by
    # Fabric(callbacks=...), logs what the events carry to another: the same files.
    # EarlyStopping stops where Lightning's own criterion says stop, on the same values.
    from lightning.fabric.loggers import CSVLogger
    from hookwrap.torch import EarlyStopping, MetricsLogger

    with preset.weave() as handle:
        fabrics_log, ours = CSVLogger(tmp_path, name="fabric"), CSVLogger(tmp_path, name="hookwrap")
        early, counter = EarlyStopping("val_loss", patience=2), FabricCounter()
        logger = MetricsLogger(loggers=[ours], flush_secs=None)
        fabric, model, optimizer = made(callbacks=[counter, early, logger], loggers=fabrics_log)
        assert fabric._callbacks == [counter]  # hookwrap's run through hookwrap, once
        with pytest.raises(hw.StopTraining, match="val_loss has not improved"):
            train(fabric, model, optimizer, epochs=len(VAL), log=True)
        fabric.call("on_train_end")  # the run's end: MetricsLogger finalizes its loggers
        fabrics_log.finalize("success")
    stopped_at = lightning_stops_at(patience=2)
    assert stopped_at == 4 and counter.validations == VAL[:stopped_at]
    assert early.step == stopped_at * BATCHES and handle.stopped is None  # raised, not caught

    def rows(logger: Any) -> list[dict[str, str]]:
        with open(os.path.join(logger.log_dir, "metrics.csv"), newline="") as file:
            return list(csv.DictReader(file))

    expected = rows(fabrics_log)
    assert len(expected) == stopped_at * (BATCHES + 1)
    assert rows(ours) == expected


def test_stop_flag_completes_the_call_and_is_decided_for_every_rank(hw, preset):
    from hookwrap.torch import EarlyStopping

    with preset.weave(stop="flag") as handle:
        fabric, model, optimizer = made(callbacks=[EarlyStopping("val_loss", patience=2)])
        done = train(fabric, model, optimizer, epochs=len(VAL), check=preset.should_stop)
        assert done == lightning_stops_at(patience=2) and preset.should_stop(fabric)
        assert str(handle.stopped).startswith("EarlyStopping")
        other, _, _ = made()
        assert not preset.should_stop(other)
    with pytest.raises(hw.HookError, match="stop must be 'raise'"):
        preset.weave(stop="break")


def test_a_resumed_run_stops_where_a_straight_one_does(hw, preset, tmp_path):
    from hookwrap.torch import BestCheckpoint, EarlyStopping

    def run(epochs: int, resume: bool, tag: str) -> tuple[Any, Any, Any, int]:
        early = EarlyStopping("val_loss", patience=2)
        fabric, model, optimizer = made(callbacks=[early])
        best = BestCheckpoint(tmp_path / f"best-{tag}.pt", model=model, optimizer=optimizer)
        hw.add_callback(fabric, best)
        first = 0
        if resume:
            state = {"model": model, "optimizer": optimizer, "epoch": 0}
            fabric.load(tmp_path / "last.pt", state)
            first = state["epoch"] + 1
        try:
            train(fabric, model, optimizer, epochs, first_epoch=first, save=tmp_path / "last.pt")
        except hw.StopTraining:
            pass
        return early, best, model, first

    with preset.weave():
        straight, straight_best, straight_model, _ = run(len(VAL), resume=False, tag="straight")
        run(3, resume=False, tag="first")  # stopped after 3 epochs (killed), saved each
        saved = torch.load(tmp_path / "last.pt", weights_only=False)
        assert saved["hookwrap"] == {  # the state after epoch 3, the last saved
            "EarlyStopping[monitor=val_loss,mode=min]": {"step": 24, "step_axis": "updates", "best": 0.8,
                                                         "best_step": 16, "wait": 1},
            f"BestCheckpoint[{tmp_path / 'best-first.pt'}]": {"step": 24, "step_axis": "updates", "best": 0.8,
                                                              "best_step": 16}}
        resumed, resumed_best, resumed_model, first = run(len(VAL), resume=True, tag="first")
    assert first == 3
    # The same stop (a fresh EarlyStopping from epoch 4 on would never stop on VAL).
    assert resumed.state_dict() == straight.state_dict() and resumed.step == lightning_stops_at(2) * BATCHES
    assert resumed_best.state_dict() == straight_best.state_dict() == {"step": 32, "step_axis": "updates", "best": 0.8,
                                                                       "best_step": 16}
    assert torch.equal(weights(resumed_model), weights(straight_model))


def test_load_without_saved_state_warns(hw, preset, tmp_path):
    from hookwrap.torch import EarlyStopping

    fabric, model, optimizer = made()
    fabric.save(tmp_path / "plain.pt", {"model": model})  # before the preset: no hookwrap state
    with preset.weave():
        fabric, model, optimizer = made(callbacks=[EarlyStopping("val_loss")])
        with pytest.warns(hw.HookwrapWarning, match="holds no 'hookwrap' state"):
            fabric.load(tmp_path / "plain.pt", {"model": model})
        whole = fabric.load(tmp_path / "plain.pt")  # the whole checkpoint: returned as it is
        assert set(whole) == {"model"}


def test_hookwrap_callbacks_and_fabric_callbacks_each_run_once(hw, preset):
    class Seen(hw.Callback):
        def __init__(self) -> None:
            self.calls: list[Any] = []

        def on_validation_end(self, fabric: Any, val_loss: float) -> None:
            self.calls.append(("validation", val_loss))

        def on_train_epoch_end(self, fabric: Any) -> None:
            self.calls.append("epoch")

        def on_my_hook(self, fabric: Any, value: int) -> None:
            self.calls.append(("mine", value))

        def post_optimizer_step(self, fabric: Any) -> None:
            self.calls.append("update")

    class Typo(hw.Callback):
        def on_validation_edn(self, fabric: Any) -> None:
            pass

    with preset.weave(hooks=("on_my_hook",)):
        seen, counter = Seen(), FabricCounter()
        fabric, model, optimizer = made(callbacks=[seen, counter])
        optimizer.step()
        fabric.call("on_validation_end", val_loss=0.5)
        fabric.call("on_train_epoch_end")
        fabric.call("on_my_hook", value=3)
        fabric.call("on_not_declared", value=4)  # Fabric's own callbacks only, as before
        losses: list[float] = []
        hw.after(fabric, "loss", lambda self, loss: losses.append(float(loss)))
        fabric.call("on_train_batch_end", loss=torch.tensor(1.0))
        fabric.call("on_train_batch_end", outputs=torch.tensor(2.0))
        fabric.call("on_train_batch_end", {"loss": torch.tensor(3.0)}, None, 0)  # Fabric's example trainer
        fabric.call("on_train_batch_end", batch_idx=0)  # no loss: a step, no loss event
        assert losses == [1.0, 2.0, 3.0]
        hw.after(fabric, "loss", lambda self, return_value: return_value * 0.5)
        with pytest.raises(hw.HookError, match="back-propagated already"):  # it would change nothing
            fabric.call("on_train_batch_end", loss=torch.tensor(1.0))
        assert seen.calls == ["update", ("validation", 0.5), "epoch", ("mine", 3)]
        assert counter.validations == [0.5] and counter.updates == 1 and counter.setups == 1
        with pytest.raises(hw.UnknownEventError, match=r"Fabric\(callbacks=\[...\]\): .* Typo .*on_validation_edn"):
            Fabric(accelerator="cpu", devices=1, callbacks=[Typo()])
    with pytest.raises(hw.HookError, match="hooks must be a tuple"):
        preset.weave(hooks="on_my_hook")


def test_nothing_deferred_is_lost_at_the_end_of_the_run(hw, preset, tmp_path):
    from hookwrap.extend import boundary
    from hookwrap.torch import MetricsLogger, NanGuard, NonFiniteError

    class Sink:
        def __init__(self) -> None:
            self.rows: list[tuple[int, dict[str, float]]] = []
            self.status: str | None = None

        def log_metrics(self, metrics: dict[str, float], step: int) -> None:
            self.rows.append((step, dict(metrics)))

        def finalize(self, status: str) -> None:
            self.status = status

    with preset.weave():
        sink = Sink()
        fabric, model, optimizer = made(callbacks=[MetricsLogger(loggers=[sink], flush_secs=None)])
        with boundary():  # the end of the run is sure to come: the logger holds its rows
            train(fabric, model, optimizer, epochs=2)
            assert sink.rows == []
            fabric.call("on_train_end")
            values = [name for _, metrics in sink.rows for name in metrics]
            assert values.count("loss") == 2 * BATCHES and values.count("val_loss") == 2
            assert sink.status == "success"
        # Stopped and never told the run ended: the block's end delivers them.
        sink = Sink()
        fabric, model, optimizer = made(callbacks=[MetricsLogger(loggers=[sink], flush_secs=None)])
        hw.after(fabric, "evaluate", lambda self: (_ for _ in ()).throw(hw.StopTraining("done")))
        with pytest.raises(hw.StopTraining), boundary():
            train(fabric, model, optimizer, epochs=2)
        # The evaluation's values in a call of their own, as fabric.log gives them.
        assert [step for step, _ in sink.rows] == list(range(1, BATCHES + 1)) + [BATCHES]
        assert sink.rows[-2][1].keys() == {"loss"} and sink.rows[-1][1].keys() == {"val_loss"}
        # A NaN the guard queued (it reads every 20 checks) is found at the run's end.
        fabric, model, optimizer = made(callbacks=[NanGuard(events="loss")])
        with boundary():
            for step in range(1, BATCHES + 1):
                optimizer.step()  # update `step`: Fabric's step is an update it runs
                fabric.call("on_train_batch_end", loss=torch.tensor(float("nan") if step == 3 else 1.0))
            with pytest.raises(NonFiniteError, match="at step 3"):
                fabric.call("on_train_end")


def test_remove_restores(hw, preset):
    from lightning.fabric.wrappers import _FabricOptimizer

    classes = (Fabric, _FabricOptimizer)
    before = [dict(vars(c)) for c in classes]
    handle = preset.weave()
    handle.remove()
    assert [dict(vars(c)) for c in classes] == before
    fabric, model, optimizer = made()
    with pytest.raises(hw.UnknownEventError):
        hw.before(fabric, "backward", lambda self: None)
    with pytest.raises(hw.HookError, match="a lightning.fabric Fabric class"):
        preset.weave(object)


def test_hookwrap_run_preset_fabric(hw, tmp_path):
    # The script knows nothing of hookwrap: --preset fabric makes its fabric.call hooks
    # events, and the logger's rows are delivered at the script's end.
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1")
    result = subprocess.run(
        [sys.executable, "-m", "hookwrap", "run", "--preset", "fabric",
         "--callback", "MetricsLogger('m.csv', tensorboard=False, flush_secs=None)",
         "--callback", "NanGuard(events='backward')", str(SCRIPT), "--epochs", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    printed = [line.split() for line in result.stdout.splitlines() if line.startswith("val_loss")]
    with open(tmp_path / "m.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [r["name"] for r in rows].count("loss") == 2 * BATCHES
    assert [(r["step"], f"{float(r['value']):.6f}") for r in rows if r["name"] == "val_loss"] == \
        [(step, value) for _, step, value in printed]


def test_stop_flag_is_the_same_decision_on_every_rank(hw, tmp_path):
    from tests.integrations import _fabric_worker
    from tests._ranks import run_ranks

    flag = "" if hw.USING_EXTENSION else "1"
    results = run_ranks(_fabric_worker.run, (2, str(tmp_path / "init"), str(tmp_path), flag, 60.0), 2, 180, tmp_path)
    assert all(r["compiled"] == hw.USING_EXTENSION for r in results)
    assert [r["epochs"] for r in results] == [2, 2]  # rank 1 stopped; rank 0 left with it
    assert results[0]["weight"] == pytest.approx(results[1]["weight"])  # DDP kept them in step


def test_every_lightning_callback_hook_is_a_custom_event_of_the_fabric(hw, preset):
    import lightning.pytorch as pl

    assert {name for name in dir(pl.Callback) if name.startswith("on_")} <= set(preset.HOOKS)
    with preset.weave():
        fabric, _, _ = made()
        seen: list[str] = []
        for name in ("on_train_epoch_end", "on_test_end", "on_exception"):
            hw.on(fabric, name, lambda self, name=name: seen.append(name))
            fabric.call(name)
        assert seen == ["on_train_epoch_end", "on_test_end", "on_exception"]


def test_grad_accumulation_is_refused_naming_fabric_own(hw, preset):
    from hookwrap.torch import GradAccumulation

    with preset.weave():
        fabric, _, _ = made()
        with pytest.raises(hw.HookError, match=r"accumulates gradients itself.*no_backward_sync"):
            hw.add_callback(fabric, GradAccumulation(2, loss_event="backward"))


def test_a_crafted_hookwrap_state_runs_no_code_and_objects_are_refused(hw, preset, tmp_path):
    """What fabric.save adds (CHECKPOINT_KEY) is plain data that loads with
    weights_only=True; Fabric's own load (weights_only by default) refuses a crafted pickle
    before anything runs, and state that is not plain data (a load with
    weights_only=False, the user's opt-in) never reaches a callback."""
    from hookwrap.torch import EarlyStopping
    from tests.torch._crafted import OpensAFile

    marker = tmp_path / "marker"
    with preset.weave():
        fabric, model, optimizer = made(callbacks=[EarlyStopping("val_loss", patience=2)])
        fabric.save(tmp_path / "ok.pt", {"model": model})
        assert torch.load(tmp_path / "ok.pt", weights_only=True)[preset.CHECKPOINT_KEY]
        key = "EarlyStopping[monitor=val_loss,mode=min]"
        torch.save({"model": model.state_dict(), preset.CHECKPOINT_KEY: {key: OpensAFile(marker)}},
                   tmp_path / "crafted.pt")
        with pytest.raises(Exception, match="Weights only load failed"):
            fabric.load(tmp_path / "crafted.pt", {"model": model})
        assert not marker.exists()
        torch.save({"model": model.state_dict(), preset.CHECKPOINT_KEY: {key: {"wait": object()}}},
                   tmp_path / "objects.pt")
        with pytest.raises(hw.HookError, match=r"load_callback_state.*builtins\.object.*plain data"):
            fabric.load(tmp_path / "objects.pt", {"model": model}, weights_only=False)


def test_spike_detection_writes_the_batches_lightning_writes(hw, preset, tmp_path):
    """Accumulating 2 batches an update, one loss spikes: SpikeDetection on the preset writes
    the skip file Lightning's own SpikeDetection writes for the same losses (its batch_idx,
    0-based), and names the update (step) the batch belongs to."""
    import json

    from lightning.fabric.utilities.spike import SpikeDetection as LightningSpikeDetection
    from lightning.fabric.utilities.spike import TrainingSpikeException

    from hookwrap.torch import SpikeDetection

    losses = [2.0 * 0.97 ** i for i in range(16)]
    losses[10] = 9.0  # batch_idx 10: the first batch of update 6
    theirs = LightningSpikeDetection(exclude_batches_path=str(tmp_path / "theirs.json"))
    for batch_idx, value in enumerate(losses):
        with contextlib.suppress(TrainingSpikeException):
            theirs.on_train_batch_end(made()[0], torch.tensor(value), None, batch_idx)
    with preset.weave():
        ours = SpikeDetection(action="log", exclude_batches_path=tmp_path / "ours.json", check_every=1)
        fabric, model, optimizer = made(callbacks=[ours])
        for batch_idx, value in enumerate(losses):
            loss = model(torch.ones(1, 4)).sum() * 0.0 + value  # the scripted value, with a graph
            fabric.backward(loss)
            if batch_idx % 2 == 1:
                optimizer.step()
                optimizer.zero_grad()
            fabric.call("on_train_batch_end", loss=loss)
        fabric.call("on_train_end")
    assert theirs.bad_batches == [9, 10]
    assert ours.bad_batches == theirs.bad_batches == json.loads((tmp_path / "theirs.json").read_text())
    assert json.loads((tmp_path / "ours.json").read_text()) == [9, 10]
    assert [step for step, _, _ in ours.spikes] == [6]
