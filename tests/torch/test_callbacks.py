"""hookwrap.torch's shipped callbacks on tiny CPU models, both implementations."""

from __future__ import annotations

import importlib
import io
import math
import os
import re
import subprocess
import sys
from typing import TypedDict

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice


class Scores(TypedDict):
    val_loss: float
    val_acc: float


def make_loop(hw, losses=(), scores=()):
    """A minimal hookable loop: each step's loss and each evaluation's scores come
    from the given sequences, so a test says exactly when a value goes bad."""

    class Loop(hw.Hookable):
        def __init__(self):
            self.model = torch.nn.Linear(2, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.losses, self.scores = iter(losses), iter(scores)
            self.stop_reason = None

        @hw.hookable
        def fit(self, epochs: int) -> None:
            try:
                for index in range(epochs):
                    self.epoch(index)
                    self.evaluate()
            except hw.StopTraining as stop:
                self.stop_reason = str(stop)

        @hw.hookable
        def epoch(self, index: int) -> None:
            for _ in range(2):
                self.step(torch.ones(4, 2))

        @hw.hookable
        def step(self, batch: torch.Tensor) -> torch.Tensor:
            out = self.model(batch).mean()
            # Exactly the scripted value, with a real gradient (so weights change).
            loss = self.loss(out - out.detach() + next(self.losses, 1.0))
            self.backward(loss)
            self.optimizer_step()
            return loss.detach()

        @hw.hookable
        def loss(self, value: torch.Tensor) -> torch.Tensor:
            return value

        @hw.hookable
        def backward(self, loss: torch.Tensor) -> None:
            loss.backward()

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad()

        @hw.hookable
        def evaluate(self) -> Scores:
            val_loss, val_acc = next(self.scores)
            return Scores(val_loss=val_loss, val_acc=val_acc)

    return Loop()


def test_import_hookwrap_never_imports_torch():
    code = "import sys, hookwrap; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- declared registrations (ShippedCallback.listens) ---------------------------------


def test_a_callback_declares_its_registrations_and_the_base_builds_them(hw, ht):
    attach = importlib.import_module("hookwrap.torch._attach")
    On = attach.On

    class Watch(attach.ShippedCallback):
        listens = (On("pre", "step_event", "started", always=True),
                   On("post", "loss_event", "seen", read="return_value"),
                   On("post", "step_event", "weights", value="model", always=True),
                   On("post", "missing_event", "never"))  # a default the loop lacks: skipped

        def __init__(self, model="model"):
            self.step_event, self.loss_event, self.model = "step", attach.DefaultEvent("loss"), model
            self.missing_event = attach.DefaultEvent("validate")
            self.seen_values, self.events = [], []

        def started(self, obj):
            self.events.append("pre-step")

        def seen(self, obj, value):
            self.seen_values.append(float(value))

        def weights(self, obj, model):
            self.events.append(type(model).__name__)

        def never(self, obj):
            raise AssertionError("registered on a join point the loop lacks")

    loop = make_loop(hw, losses=[0.5, 0.25], scores=[(1.0, 0.5)])
    watch = Watch()
    assert [event for event, _ in watch.event_methods(type(loop))] == ["pre-step", "post-loss", "post-step"]
    loop.add_callback(watch)
    loop.fit(1)
    assert watch.seen_values == [0.5, 0.25] and watch.events == ["pre-step", "Linear"] * 2

    class Bare(attach.ShippedCallback):
        pass

    with pytest.raises(NotImplementedError, match="Bare declares no listens"):
        Bare().event_methods(type(loop))


# --- NanGuard -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("sync", [True, False])
def test_nan_guard_stops_naming_event_step_and_value(hw, ht, bad, sync):
    loop = make_loop(hw, losses=[0.5, 0.4, bad, 0.3], scores=[(1.0, 0.5)] * 3)
    guard = ht.NanGuard(sync=sync)
    loop.add_callback(guard)
    with pytest.raises(ht.NonFiniteError, match=rf"event 'post-loss' returned {bad} at step 3 \(Loop\)"):
        loop.fit(3)
    # sync=True stops in the bad step; by default the check is read back at the
    # end of that epoch (two steps each), one step later, still naming step 3.
    assert guard.checked == (3 if sync else 4)


def test_nan_guard_says_when_no_step_was_counted(hw, ht):
    loop = make_loop(hw, losses=[math.nan])
    loop.add_callback(ht.NanGuard(step_event=None))  # counts no steps
    with pytest.raises(ht.NonFiniteError, match=r"'post-loss' returned nan before any step was counted \(Loop\)"):
        loop.fit(1)


def test_nan_guard_checks_metrics_mappings_and_other_events(hw, ht):
    loop = make_loop(hw, scores=[(1.0, 0.5), (math.nan, 0.5)])
    loop.add_callback(ht.NanGuard(events=("loss", "evaluate")))
    with pytest.raises(ht.NonFiniteError, match=r"'post-evaluate' returned nan\['val_loss'\] at step 4"):
        loop.fit(3)


def test_nan_guard_refuses_an_event_the_target_lacks(hw, ht):
    loop = make_loop(hw)
    with pytest.raises(hw.UnknownEventError, match=r"NanGuard: .*Loop has no join point 'los'\. Did you mean 'loss'"):
        loop.add_callback(ht.NanGuard(events="los"))
    with pytest.raises(hw.UnknownEventError, match=r"no join point 'train_step'\. Did you mean .*'step'"):
        loop.add_callback(ht.NanGuard(step_event="train_step"))
    assert loop.callbacks == []  # nothing half-registered


# --- EarlyStopping and StopTraining ----------------------------------------------


def test_early_stopping_counts_patience_and_ends_fit(hw, ht):
    scores = [(1.0, 0.1), (0.8, 0.2), (0.79, 0.3), (0.85, 0.3), (0.9, 0.3), (0.1, 0.9)]
    loop = make_loop(hw, scores=scores)
    stopper = ht.EarlyStopping("val_loss", mode="min", patience=2, min_delta=0.05)
    loop.add_callback(stopper)
    errors = []
    loop.on_error("evaluate", lambda self, exception: errors.append(exception))
    loop.on_error("fit", lambda self, exception: errors.append(exception))
    loop.fit(10)
    # 0.79 is no improvement by more than 0.05 on 0.8; nor are 0.85 and 0.9... but
    # patience 2 ends it at the second non-improvement.
    assert stopper.best.value == 0.8 and stopper.wait == 2
    assert "val_loss has not improved by more than 0.05 for 2 evaluations" in loop.stop_reason
    assert "best 0.8 at step 4" in loop.stop_reason
    assert errors == []  # StopTraining is control flow: error callbacks do not run


def test_early_stopping_small_gains_name_the_step_of_the_best_they_set(hw, ht):
    """small_gains_set_best (HF's reading): a gain within min_delta is no improvement,
    yet becomes the best; the stop message names the step of that best."""
    scores = [(1.0, 0.1), (0.99, 0.2), (0.98, 0.3), (0.1, 0.9)]
    loop = make_loop(hw, scores=scores)
    stopper = ht.EarlyStopping("val_loss", patience=2, min_delta=0.05, small_gains_set_best=True)
    loop.add_callback(stopper)
    loop.fit(10)
    assert stopper.best.value == 0.98 and stopper.wait == 2
    assert "(best 0.98 at step 6, now 0.98)" in loop.stop_reason, loop.stop_reason


def test_early_stopping_max_mode_reads_an_argument_or_return_value(hw, ht):
    loop = make_loop(hw, scores=[(0, 0.5), (0, 0.4), (0, 0.3)])
    loop.add_callback(ht.EarlyStopping("val_acc", mode="max", patience=1))
    loop.fit(5)
    assert "val_acc has not improved" in loop.stop_reason

    arg_loop = make_loop(hw, scores=[(0, 0)] * 9)
    stopper = ht.EarlyStopping("index", mode="max", patience=1, event="epoch")
    arg_loop.add_callback(stopper)  # the epoch index only grows: never stops
    arg_loop.fit(4)
    assert arg_loop.stop_reason is None and stopper.best.value == 3


def test_early_stopping_errors_at_attach_time(hw, ht):
    loop = make_loop(hw)
    with pytest.raises(hw.HookError, match=r"mode must be 'min' or 'max', got 'lowest'"):
        ht.EarlyStopping(mode="lowest")
    with pytest.raises(hw.HookError, match=(
            r"EarlyStopping\(monitor='val_los'\): join point 'evaluate' \(.*Loop.evaluate\) never "
            r"provides 'val_los'.*keys: val_acc, val_loss.*Did you mean 'val_loss'")):
        loop.add_callback(ht.EarlyStopping("val_los"))
    with pytest.raises(hw.HookError, match=r"never provides 'val_loss'.*it is not a mapping"):
        loop.add_callback(ht.EarlyStopping("val_loss", event="loss"))
    with pytest.raises(hw.UnknownEventError, match=r"no join point 'evaluation'.*Did you mean 'evaluate'"):
        loop.add_callback(ht.EarlyStopping(event="evaluation"))


def test_a_key_missing_at_run_time_is_named(hw, ht):
    class Loop(hw.Hookable):
        @hw.hookable
        def evaluate(self) -> dict:  # the annotation does not say which keys
            return {"acc": 1.0}

    loop = Loop()
    loop.add_callback(ht.EarlyStopping("val_loss", step_event=None))
    with pytest.raises(hw.HookError, match=r"post-evaluate returned 'acc', with no 'val_loss'"):
        loop.evaluate()


# --- BestCheckpoint ----------------------------------------------------------------


def test_best_checkpoint_writes_atomically_and_restores_the_best(hw, ht, tmp_path, renames):
    path = tmp_path / "ckpt" / "best.pt"
    loop = make_loop(hw, scores=[(0.9, 0), (0.5, 0), (0.7, 0), (0.6, 0)])
    saver = ht.BestCheckpoint(path, monitor="val_loss", restore_best=True)
    loop.add_callback(saver)
    weights_at = []
    loop.after("evaluate", lambda self: weights_at.append(self.model.weight.detach().clone()))
    loop.fit(4)
    assert saver.saved == 2 and saver.best.value == 0.5 and saver.best_step == 4
    assert [dst for _, dst in renames] == ["best.pt", "best.pt"]
    assert all(src.startswith(".best.pt.") and src.endswith(".tmp") for src, _ in renames)
    assert os.listdir(path.parent) == ["best.pt"]  # no temporary file left behind
    saved = torch.load(path, weights_only=True)
    assert set(saved) == {"model", "optimizer", "monitor", "value", "step"} and saved["value"] == 0.5
    # restore_best: after fit, the model holds the weights of the second evaluation.
    assert torch.equal(loop.model.weight, weights_at[1])
    assert not torch.equal(weights_at[1], weights_at[3])


@pytest.mark.parametrize("scores", [[(math.nan, 0)] * 3, []], ids=["metric-nan-at-every-evaluation", "no-evaluation"])
def test_best_checkpoint_restores_only_what_its_own_run_saved(hw, ht, tmp_path, scores):
    # It loaded the file an earlier run had left at path into this run's model.
    path = tmp_path / "best.pt"
    earlier = make_loop(hw, scores=[(0.1, 0)])
    earlier.add_callback(ht.BestCheckpoint(path, monitor="val_loss"))
    earlier.fit(1)
    assert path.exists()
    loop = make_loop(hw, scores=scores)
    saver = ht.BestCheckpoint(path, monitor="val_loss", restore_best=True)
    loop.add_callback(saver)
    if not scores:  # a fit that never evaluates
        loop.evaluate = lambda: None
    ended_with = []
    loop.after("epoch", lambda self: ended_with.append(self.model.weight.detach().clone()))
    with pytest.warns(hw.HookwrapWarning) as warned:
        loop.fit(len(scores) or 1)
    assert saver.saved == 0 and not torch.equal(ended_with[-1], earlier.model.weight)
    assert torch.equal(loop.model.weight, ended_with[-1])  # the weights it ended with
    why = ("val_loss had no finite value at any of its 3 evaluation(s) ('evaluate'), so none was saved"
           if scores else "'evaluate' never ran, so no value of val_loss was seen")
    assert [str(w.message) for w in warned] == [
        f"BestCheckpoint({str(path)!r}): restore_best restored nothing: {why}. The model keeps the weights it "
        f"ended with; {str(path)!r} was not read."]
    assert torch.equal(torch.load(path, weights_only=True)["model"]["weight"], earlier.model.weight)  # left as it was


def test_best_checkpoint_names_a_missing_model_attribute(hw, ht, tmp_path):
    loop = make_loop(hw, scores=[(0.9, 0)])
    loop.add_callback(ht.BestCheckpoint(tmp_path / "b.pt", model="net"))
    with pytest.raises(hw.HookError, match=r"Loop has no attribute 'net' to read the model from"):
        loop.fit(1)


# --- state ------------------------------------------------------------------------


def test_callback_state_round_trips_through_torch_save(hw, ht, tmp_path):
    scores = [(1.0, 0), (0.5, 0), (0.6, 0), (0.7, 0), (0.8, 0)]
    first = make_loop(hw, scores=scores[:3])
    first.add_callback(ht.EarlyStopping(patience=2))
    first.add_callback(ht.NanGuard())
    first.fit(3)
    torch.save({"callbacks": hw.callback_state(first)}, tmp_path / "state.pt")

    resumed = make_loop(hw, scores=scores[3:])
    stopper = ht.EarlyStopping(patience=2)
    guard = ht.NanGuard()
    resumed.add_callback(stopper)
    resumed.add_callback(guard)
    hw.load_callback_state(resumed, torch.load(tmp_path / "state.pt", weights_only=False)["callbacks"])
    assert (stopper.best.value, stopper.wait, guard.step) == (0.5, 1, 6)
    resumed.fit(5)  # one more non-improvement completes the patience
    assert "for 2 evaluations" in resumed.stop_reason and stopper.step == 8


def test_two_callbacks_of_one_kind_get_distinct_keys_across_tiers(hw, ht):
    loop = make_loop(hw)
    a, b = ht.EarlyStopping(patience=2), ht.EarlyStopping(patience=5)
    loop.add_callback(a)
    loop.add_callback(b)
    c = ht.EarlyStopping("val_acc", mode="max")
    with c:  # the global tier
        keys = list(hw.callback_state(loop))
    assert keys == ["EarlyStopping[monitor=val_loss,mode=min]",
                    "EarlyStopping[monitor=val_loss,mode=min]#2",
                    "EarlyStopping[monitor=val_acc,mode=max]"]
    assert "StepTimer" not in hw.callback_state(loop)


def test_a_global_monitor_is_not_refused_for_an_unrelated_class(hw, ht):
    class OnlyLoss(TypedDict):
        val_loss: float

    class Narrow(hw.Hookable):  # unrelated: its evaluate never provides val_acc
        @hw.hookable
        def evaluate(self) -> OnlyLoss:
            return OnlyLoss(val_loss=1.0)

    loop = make_loop(hw, scores=[(0, 0.5), (0, 0.4), (0, 0.3)])
    with ht.EarlyStopping("val_acc", mode="max", patience=1):  # the global tier
        loop.fit(5)
    assert "val_acc has not improved" in loop.stop_reason
    assert Narrow().evaluate() == {"val_loss": 1.0}


def test_load_callback_state_is_strict_about_what_matches(hw, ht):
    loop = make_loop(hw)
    loop.add_callback(ht.NanGuard())
    with pytest.raises(hw.HookError, match=(
            r"saved state for 'EarlyStopping\[monitor=val_loss,mode=min\]', which no attached "
            r"callback takes; no saved state for attached 'NanGuard\[loss\]'")):
        hw.load_callback_state(loop, {"EarlyStopping[monitor=val_loss,mode=min]": {}})
    hw.load_callback_state(loop, {"NanGuard[loss]": {"step": 7}, "Other": {}}, strict=False)
    assert hw.callback_state(loop) == {"NanGuard[loss]": {"step": 7}}


@pytest.mark.parametrize("saved, message", [
    ({"NanGuard[loss]": "step 7"}, r"the state saved for 'NanGuard\[loss\]' is a str, not the dict"),
    ({"NanGuard[loss]": {}}, r"'NanGuard\[loss\]' could not load its saved state \(KeyError: 'step'\); nothing was loaded"),
    ({"NanGuard[loss]": {"step": 9}, "EarlyStopping[monitor=val_loss,mode=min]": {"step": 3}},
     r"'EarlyStopping\[monitor=val_loss,mode=min\]' could not load its saved state"),
])
def test_bad_saved_state_is_refused_and_nothing_is_loaded(hw, ht, saved, message):
    """Audit item 22: a bare TypeError/KeyError, or a half-loaded resume, before."""
    loop = make_loop(hw)
    loop.add_callback(ht.NanGuard())
    loop.add_callback(ht.EarlyStopping("val_loss"))
    before = hw.callback_state(loop)
    with pytest.raises(hw.HookError, match=message):
        hw.load_callback_state(loop, saved, strict=False)
    assert hw.callback_state(loop) == before


@pytest.mark.parametrize("name, field, bad", [
    ("EarlyStopping", "wait", "1"),
    ("EarlyStopping", "wait", -1),
    ("EarlyStopping", "step", "5"),
    ("EarlyStopping", "best_step", 2.5),
    ("EarlyStopping", "best", "0.5"),
    ("EarlyStopping", "best", math.nan),
    ("NanGuard", "step", True),
    ("Checkpoint", "epoch", "2"),
    ("Checkpoint", "top_k", [["0.5", 2, "best-epoch=1-step=2.pt"]]),
    ("Checkpoint", "top_k", [[0.5, 2, "../outside.pt"]]),  # evicting it would delete a file elsewhere
    ("Checkpoint", "top_k", "best.pt"),
    ("EMA", "updates", "3"),
    ("EMA", "shadow", ["not a tensor"]),
    ("GradAccumulation", "calls", "1"),
])
def test_saved_state_of_the_wrong_type_is_refused_and_nothing_is_loaded(hw, ht, tmp_path, name, field, bad):
    # EarlyStopping took "1" as its wait count: the run failed at the next `+= 1`, or compared wrongly.
    loop = make_loop(hw)
    callbacks = [ht.NanGuard(), ht.EarlyStopping("val_loss"), ht.Checkpoint(tmp_path, monitor="val_loss"),
                 ht.EMA(), ht.GradAccumulation(2)]
    for cb in callbacks:
        loop.add_callback(cb)
    before = hw.callback_state(loop)
    state = {key: {**value, "step": 7} if key.startswith("NanGuard") else dict(value) for key, value in before.items()}
    key = next(key for key in state if key.startswith(name))
    state[key][field] = bad
    with pytest.raises(hw.HookError) as raised:
        hw.load_callback_state(loop, state)
    message = str(raised.value)
    assert f"{key!r} could not load its saved state (TypeError: " in message and "nothing was loaded" in message
    assert f"the saved {field!r} must be " in message and f"got {bad!r}" in message
    assert hw.callback_state(loop) == before  # NanGuard's step 7, loaded first, was put back
    # Read whole before anything is set: loading it directly leaves the callback as it was.
    cb = next(cb for cb in callbacks if cb.state_key == key)
    with pytest.raises(TypeError):
        cb.load_state_dict(state[key])
    assert cb.state_dict() == before[key]


def test_saved_state_of_the_right_types_still_loads(hw, ht, tmp_path):
    loop = make_loop(hw)
    stopper, checkpoint = ht.EarlyStopping("val_loss"), ht.Checkpoint(tmp_path, monitor="val_loss")
    loop.add_callback(stopper)
    loop.add_callback(checkpoint)
    hw.load_callback_state(loop, {
        stopper.state_key: {"step": 6, "best": 1, "best_step": 4, "wait": 2},
        checkpoint.state_key: {"step": 6, "best": 0.5, "best_step": 4, "epoch": 3,
                               "top_k": [[0.5, 4, "best-epoch=2-step=4.pt"]]}})
    assert (stopper.step, stopper.best.value, stopper.best_step, stopper.wait) == (6, 1.0, 4, 2)
    assert type(stopper.best.value) is float
    assert checkpoint.top_k == [(0.5, 4, "best-epoch=2-step=4.pt")] and checkpoint.epoch == 3


# --- ProgressBar, StepTimer, GradNorm, LRMonitor, MetricsLogger ---------------------


def test_progress_bar_writes_loss_and_metrics_to_its_stream(hw, ht):
    stream = io.StringIO()
    loop = make_loop(hw, losses=[0.25] * 6, scores=[(0.5, 0.75)] * 3)
    with ht.ProgressBar(total=2, file=stream, postfix_every=1, mininterval=0):
        loop.fit(3)
    text = stream.getvalue()
    assert "epoch 3: 100%" in text and "2/2" in text
    assert "loss=0.2500" in text and "val_loss=0.5000" in text and "val_acc=0.7500" in text


def test_step_timer_times_every_step(hw, ht):
    loop = make_loop(hw, scores=[(0, 0)] * 2)
    timer = ht.StepTimer()
    loop.add_callback(timer)
    loop.fit(2)
    assert timer.count == 4 and all(t > 0 for t in timer.times)
    assert timer.mean() > 0 and timer.median() > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_step_timer_on_cuda_reads_events_lazily(hw, ht):
    loop = make_loop(hw, scores=[(0, 0)] * 2)
    timer = ht.StepTimer(device="cuda")
    loop.add_callback(timer)
    loop.fit(2)
    assert timer.count == 4 and all(t > 0 for t in timer.times)


def test_step_timer_refuses_cuda_where_there_is_none(hw, ht):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(hw.HookError, match="CUDA is not available here"):
        ht.StepTimer(device="cuda")


@pytest.mark.parametrize("make, message", [
    (lambda ht: ht.EarlyStopping(patience=0), "EarlyStopping: patience must be a whole number >= 1, got 0"),
    (lambda ht: ht.EarlyStopping(patience=1.5), "EarlyStopping: patience must be a whole number >= 1, got 1.5"),
    (lambda ht: ht.EarlyStopping(patience=True), "EarlyStopping: patience must be a whole number >= 1, got True"),
    (lambda ht: ht.GradNorm(every=0), "GradNorm: every must be a whole number >= 1, got 0"),
    (lambda ht: ht.MetricsLogger("m.csv", every="2"), "MetricsLogger: every must be a whole number >= 1, got '2'"),
    (lambda ht: ht.EarlyStopping(mode="best"), "mode must be 'min' or 'max'"),
    (lambda ht: ht.EarlyStopping(stopping_threshold=float("nan")), "stopping_threshold must be a finite number"),
    (lambda ht: ht.Checkpoint("ck", every_n_minutes=0),
     "every_n_minutes must be a number > 0 and finite (the wall-clock time between saves), got 0"),
    (lambda ht: ht.EarlyStopping(stopping_threshold=2.0, divergence_threshold=1.0),
     "stopping_threshold=2.0 (good enough) must be below divergence_threshold=1.0 (hopeless) with mode='min'"),
])
def test_bad_settings_of_shipped_callbacks_raise_hook_error(hw, ht, make, message):
    with pytest.raises(hw.HookError, match=re.escape(message)):
        make(ht)


def test_grad_norm_lr_monitor_and_metrics_logger(hw, ht, tmp_path):
    loop = make_loop(hw, losses=[1.0] * 6, scores=[(0.5, 0.25)] * 3)
    log = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    norm, lrs = ht.GradNorm(every=2, logger=log), ht.LRMonitor(logger=log)
    for cb in (norm, lrs, log):
        loop.add_callback(cb)
    loop.fit(3)
    assert [step for step, _ in norm.history] == [2, 4, 6]
    assert all(value >= 0 for _, value in norm.history)
    assert lrs.history == [(1, [0.1])]
    rows = log.read()
    assert [r for r in rows if r[1] == "loss"] == [(s, "loss", 1.0) for s in range(1, 7)]
    assert (2, "val_loss", 0.5) in rows and (6, "val_acc", 0.25) in rows
    assert sum(r[1] == "grad_norm" for r in rows) == 3 and sum(r[1] == "lr" for r in rows) == 6
    header = (tmp_path / "m.csv").read_text().splitlines()[0]
    assert header == "step,name,value"


def test_metrics_logger_writes_tensorboard_when_installed(hw, ht, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    loop = make_loop(hw, scores=[(0.5, 0.25)])
    log = ht.MetricsLogger(tmp_path / "m.csv")
    loop.add_callback(log)
    loop.fit(1)
    assert log.tensorboard_dir == tmp_path / "m_tensorboard"
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(log.tensorboard_dir))


def test_shipped_callbacks_work_globally_and_can_be_ordered(hw, ht):
    loop = make_loop(hw, scores=[(0, 0)])
    guard = ht.NanGuard()
    checked_before = []
    loop.add_callback(guard)
    loop.after("loss", lambda self: checked_before.append(guard.checked), before=guard)
    with ht.StepTimer() as timer:  # the global tier
        loop.fit(1)
    assert checked_before == [0, 1] and guard.checked == 2  # ran before the guard each step
    assert timer.count == 2
    described = str(hw.describe(loop, "loss"))
    assert "NanGuard.check[loss]" in described


# --- the demo ------------------------------------------------------------------------


def test_demo_trains_stops_early_and_reports(hw, tmp_path):
    demo = importlib.import_module("hookwrap.demo")
    lines, stream = [], io.StringIO()
    report = demo.run(epochs=20, out=lines.append, stream=stream, workdir=str(tmp_path))
    text = "\n".join(lines)
    assert lines[0].startswith("training an MLP on cpu")  # the class `callbacks` list
    assert report["stopped"] and "EarlyStopping: val_loss" in report["stopped"]
    assert report["epochs"] < 20 and report["steps"] == 52 * report["epochs"]
    assert report["samples"] == report["steps"] * 32 - report["epochs"] * (32 - 1638 % 32)
    assert report["metrics"]["val_acc"] > 0.5  # it learned something (4 classes)
    assert len(report["trainer"].history) == report["epochs"]  # the post_evaluate_callback method
    assert (tmp_path / "best.pt").exists() and (tmp_path / "metrics.csv").exists()
    assert report["timer"].count >= report["steps"] and report["plain_step"] > 0
    # hookwrap's own cost per step, apart from the callbacks' work shown by hand and through hookwrap
    own_line = next(line for line in lines if line.startswith("hook overhead (hookwrap's own): "))
    assert " us a step = " in own_line and "15 callback calls vs. by hand" in own_line and len(own_line) <= 130
    assert any(line.startswith("callbacks' work (theirs): ") for line in lines)
    costs = report["costs"]
    assert report["overhead"] == costs.own.value and costs.own.low <= costs.own.value <= costs.own.high
    assert report["noisy"] == costs.own.noisy and costs.calls == 15 and report["hand_step"] > 0
    assert any(line.startswith("note: the machine was too noisy") for line in lines) == report["noisy"]
    rates = report["rates"]  # Throughput's last 50-step window of training: batches of 32 (one of 6)
    assert rates["samples_per_sec"] == pytest.approx(32 * rates["steps_per_sec"], rel=0.02)
    assert f"{rates['samples_per_sec']:,.0f} samples/s" in text
    assert report["ranges"] == {f"hookwrap:{e}": 3 for e in ("step", "loss", "backward", "optimizer_step")}
    assert report["trace"] == tmp_path / "profile" / "trace_rank0.json" and report["trace"].exists()
    assert lines[-2].startswith("profile (Profiler, 3 steps after training): ")
    assert lines[-1] == f"dispatch: {'compiled' if hw.USING_EXTENSION else 'pure Python'}"
    assert "epoch 1: 100%" in stream.getvalue()  # the global ProgressBar


def test_demo_without_hooks(hw):
    demo = importlib.import_module("hookwrap.demo")
    lines = []
    report = demo.run(epochs=2, hooks=False, out=lines.append)
    assert report["steps"] == 104 and "without callbacks" in lines[0]


def test_version_is_single_sourced():
    import importlib.metadata

    import hookwrap

    out = subprocess.run([sys.executable, "-m", "hookwrap", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == f"hookwrap {hookwrap.__version__}\n"
    assert importlib.metadata.version("hookwrap") == hookwrap.__version__


def test_demo_command_says_what_to_install_without_torch():
    code = ("import sys; sys.modules['torch'] = None; from hookwrap.__main__ import main; "
            "sys.exit(main(['demo']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2
    assert 'python -m pip install "hookwrap[torch]" torch==2.13.0' in out.stderr


def test_demo_command_checks_its_options():
    out = subprocess.run([sys.executable, "-m", "hookwrap", "demo", "--epochs", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--epochs must be at least 1" in out.stderr
    assert out.stderr.startswith("usage: hookwrap demo ")  # the subcommand's usage, not the root's
    for device, message in (("tpu", "--device tpu: not a device torch knows; use cpu, cuda (cuda:N) or mps"),
                            ("meta", "--device meta: the demo trains on cpu, cuda or mps, not meta")):
        out = subprocess.run([sys.executable, "-m", "hookwrap", "demo", "--device", device],
                             capture_output=True, text=True)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    if not torch.cuda.is_available():
        out = subprocess.run([sys.executable, "-m", "hookwrap", "demo", "--device", "cuda"],
                             capture_output=True, text=True)
        assert out.returncode == 2 and "CUDA is not available here" in out.stderr


def test_one_logger_protocol_and_the_optimizer_as_the_hooked_object(hw, ht, tmp_path):
    """A logger with log_metrics(metrics, step) (Lightning's, mlflow) serves GradNorm and
    LRMonitor as it serves MetricsLogger, read back in batches; LRMonitor attached to the
    optimizer itself reads it, not an attribute it lacks."""
    weave_optimizers = importlib.import_module("hookwrap.integrations.torch_optim").weave_optimizers

    class Sink:
        def __init__(self) -> None:
            self.rows: list[tuple[int, dict[str, float]]] = []

        def log_metrics(self, metrics: dict[str, float], step: int) -> None:
            self.rows.append((step, dict(metrics)))

    boundary = importlib.import_module("hookwrap.extend").boundary
    sink = Sink()
    with weave_optimizers(event="optimizer_step"):
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.25)
        monitor = ht.LRMonitor(logger=sink, step_event=None)
        hw.add_callback(opt, monitor)
        with boundary():  # a plain loop: what is held arrives at its end (no read per step)
            for _ in range(3):
                model(torch.ones(1, 2)).sum().backward()
                opt.step()
            assert sink.rows == []
    assert monitor.history == [(0, [0.25])]
    assert sink.rows == [(0, {"lr": 0.25})] * 3
