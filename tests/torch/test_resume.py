"""hookwrap.torch.Checkpoint: last / every-N / top-k files, each holding the whole
state of a run, and a resume that continues it exactly (both implementations).

The resume tests use the loop of tests/torch/_resume_worker.py: shuffled with torch's
RNG, dropout, loss jitter from ``random`` and NumPy, a StepLR scheduler and
EarlyStopping. A run killed mid-epoch and resumed from ``last.pt`` must reach the
same weights (``torch.equal``) and stop at the same evaluation as a run that never
stopped; each thing left out of the restore (an RNG, the scheduler, the callback
state) makes it differ, so the test would catch its loss."""

from __future__ import annotations

import importlib
import os
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytest.importorskip("numpy", reason="the resume loop draws from NumPy's RNG")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice

from tests.torch import _resume_worker as worker
from tests._ranks import run_ranks


def _same_weights(a: Any, b: Any) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


# --- resume: the same run as one that never stopped ---------------------------------


@pytest.mark.parametrize("kill_at", [22, 75])  # mid-epoch 3 (early), mid-epoch 12 (EarlyStopping waiting)
def test_a_killed_run_resumed_from_last_reaches_the_same_weights_and_stop(hw, ht, tmp_path, kill_at):
    straight = worker.build(hw, ht, str(tmp_path / "straight"))
    straight.fit(worker.EPOCHS)
    assert straight.stopped is not None and straight.stop_epoch == 12  # the decision under test
    assert straight.steps == 78  # 13 epochs of 6 steps

    killed = worker.build(hw, ht, str(tmp_path / "killed"), kill_at=kill_at)
    with pytest.raises(worker.Killed):
        killed.fit(worker.EPOCHS)
    assert killed.steps == kill_at and not _same_weights(killed, straight)

    resumed = worker.build(hw, ht, str(tmp_path / "killed"))
    start = worker.resume(resumed)
    assert start == kill_at // 6  # last.pt: the end of the last whole epoch
    assert resumed.checkpoint.epoch == start and resumed.checkpoint.step == start * 6
    resumed.fit(worker.EPOCHS, start_epoch=start)
    assert _same_weights(resumed, straight)
    assert (resumed.stopped, resumed.stop_epoch, resumed.steps) == (
        straight.stopped, straight.stop_epoch, straight.steps)
    assert resumed.evaluations == straight.evaluations[start:]
    assert torch.equal(torch.load(tmp_path / "killed" / "last.pt", weights_only=True)["model"]["0.weight"],
                       torch.load(tmp_path / "straight" / "last.pt", weights_only=True)["model"]["0.weight"])


def _spoil_torch() -> None:
    torch.manual_seed(12345)


def _spoil_python() -> None:
    random.seed(12345)


def _spoil_numpy() -> None:
    import numpy
    numpy.random.seed(12345)


@pytest.mark.parametrize("spoil", [_spoil_torch, _spoil_python, _spoil_numpy],
                         ids=["torch-rng", "python-rng", "numpy-rng"])
def test_each_rng_left_unrestored_changes_the_run(hw, ht, tmp_path, spoil):
    """The resume test above would fail if an RNG state were not restored."""
    straight = worker.build(hw, ht, str(tmp_path / "straight"))
    straight.fit(worker.EPOCHS)
    killed = worker.build(hw, ht, str(tmp_path / "killed"), kill_at=22)
    with pytest.raises(worker.Killed):
        killed.fit(worker.EPOCHS)
    resumed = worker.build(hw, ht, str(tmp_path / "killed"))
    start = worker.resume(resumed)
    spoil()  # as if that RNG had not been restored
    resumed.fit(worker.EPOCHS, start_epoch=start)
    assert not _same_weights(resumed, straight)


def test_scheduler_and_callback_state_left_out_change_the_run(hw, ht, tmp_path):
    straight = worker.build(hw, ht, str(tmp_path / "straight"))
    straight.fit(worker.EPOCHS)
    early = worker.build(hw, ht, str(tmp_path / "early"), kill_at=22)
    with pytest.raises(worker.Killed):
        early.fit(worker.EPOCHS)
    # Without the scheduler's state its next decay comes late (the optimizer's
    # state holds the current rate, not when to change it): other weights.
    no_scheduler = worker.build(hw, ht, str(tmp_path / "early"))
    state = no_scheduler.checkpoint.resume(no_scheduler, scheduler=None)
    assert no_scheduler.scheduler.last_epoch == 0 and state["scheduler"]["last_epoch"] == 3
    no_scheduler.fit(worker.EPOCHS, start_epoch=state["epoch"])
    assert not _same_weights(no_scheduler, straight)
    # Without EarlyStopping's state (patience count, best value) it stops later.
    late = worker.build(hw, ht, str(tmp_path / "late"), kill_at=75)
    with pytest.raises(worker.Killed):
        late.fit(worker.EPOCHS)
    fresh_stopper = worker.build(hw, ht, str(tmp_path / "late"))
    state = fresh_stopper.checkpoint.resume(fresh_stopper)
    hw.load_callback_state(fresh_stopper, {
        key: value for key, value in hw.callback_state(worker.build(hw, ht, str(tmp_path / "x"))).items()
        if key.startswith("EarlyStopping")}, strict=False)
    fresh_stopper.fit(worker.EPOCHS, start_epoch=state["epoch"])
    assert straight.stop_epoch == 12 and fresh_stopper.stop_epoch != 12


def test_the_file_holds_every_part_of_the_state(hw, ht, tmp_path):
    loop = worker.build(hw, ht, str(tmp_path))
    loop.fit(2)
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert set(saved) == {"model", "optimizer", "scheduler", "step", "epoch", "rng", "callbacks",
                          "monitor", "best"}
    assert (saved["step"], saved["epoch"]) == (12, 2)
    assert len(saved["rng"]) == 1 and {"python", "torch", "numpy"} <= set(saved["rng"][0])
    assert set(saved["callbacks"]) == {"EarlyStopping[monitor=val_loss,mode=min]", f"Checkpoint[{tmp_path}]"}
    assert saved["callbacks"]["EarlyStopping[monitor=val_loss,mode=min]"]["step"] == 12


def test_resume_from_restores_at_the_start_of_fit(hw, ht, tmp_path):
    first = worker.build(hw, ht, str(tmp_path))
    first.fit(3)
    again = worker.build(hw, ht, str(tmp_path), resume_from="last")
    assert not _same_weights(again, first)
    again.fit(3, start_epoch=3)  # nothing left to run: fit restores, then ends
    assert _same_weights(again, first) and again.checkpoint.epoch == 3 and again.checkpoint.step == 18
    # "last" with no file yet: a fresh start, not an error.
    fresh = worker.build(hw, ht, str(tmp_path / "empty"), resume_from="last")
    fresh.fit(1)
    assert fresh.checkpoint.epoch == 1


def test_resume_of_a_missing_file_says_so(hw, ht, tmp_path):
    loop = worker.build(hw, ht, str(tmp_path))
    with pytest.raises(hw.HookError, match=r"no checkpoint to resume from at .*last\.pt"):
        loop.checkpoint.resume(loop)
    assert loop.checkpoint.resume(loop, missing_ok=True) is None
    with pytest.raises(hw.HookError, match=r"no checkpoint to resume from at 'best'"):
        loop.checkpoint.resume(loop, "best")


# --- which files ----------------------------------------------------------------------


def make_loop(hw, ht, scores, **checkpoint):
    """A loop of 2 steps per epoch whose evaluations return ``scores`` in turn."""

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(2, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.scores = iter(scores)
            self.weights_at: dict[int, Any] = {}

        @hw.hookable
        def fit(self, epochs: int) -> None:
            for index in range(epochs):
                self.epoch(index)
                self.evaluate()

        @hw.hookable
        def epoch(self, index: int) -> None:
            for _ in range(2):
                self.step(torch.ones(3, 2))

        @hw.hookable
        def step(self, batch: Any) -> Any:
            self.optimizer.zero_grad()
            loss = self.model(batch).pow(2).mean()
            loss.backward()
            self.optimizer.step()
            return loss.detach()

        @hw.hookable
        def evaluate(self) -> dict[str, float]:
            self.weights_at[len(self.weights_at) + 1] = self.model.weight.detach().clone()
            return {"val_acc": next(self.scores)}

    loop = Loop()
    loop.checkpoint = ht.Checkpoint(loop_dir := checkpoint.pop("dir"), **checkpoint)
    loop.add_callback(loop.checkpoint)
    assert loop_dir
    return loop


def test_top_k_keeps_only_the_k_best_files(hw, ht, tmp_path):
    scores = [0.5, 0.7, 0.6, 0.9, 0.55, 0.8]
    loop = make_loop(hw, ht, scores, dir=tmp_path, monitor="val_acc", mode="max", save_top_k=2,
                     save_last=False)
    loop.fit(len(scores))
    # Best 0.9 (evaluation 4, step 8) and 0.8 (evaluation 6, step 12).
    assert sorted(os.listdir(tmp_path)) == ["best-epoch=4-step=8.pt", "best-epoch=6-step=12.pt"]
    assert loop.checkpoint.top_k == [(0.9, 8, "best-epoch=4-step=8.pt"), (0.8, 12, "best-epoch=6-step=12.pt")]
    assert loop.checkpoint.best_path == tmp_path / "best-epoch=4-step=8.pt"
    for name, evaluation in (("best-epoch=4-step=8.pt", 4), ("best-epoch=6-step=12.pt", 6)):
        saved = torch.load(tmp_path / name, weights_only=True)
        assert torch.equal(saved["model"]["weight"], loop.weights_at[evaluation])
    # "best" resumes from the best one.
    assert loop.checkpoint.resume(loop, "best")["step"] == 8
    assert torch.equal(loop.model.weight, loop.weights_at[4])


def _evaluations_at_one_step(hw, ht, tmp_path, scores, fit):
    """A loop evaluating ``scores`` in turn with no step between, through ``fit`` or
    (no fit join point: each file written when due) alone; its weight is the score."""

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model = torch.nn.Linear(1, 1, bias=False)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

        @hw.hookable
        def evaluate(self, score: float) -> dict[str, float]:
            with torch.no_grad():
                self.model.weight.fill_(score)
            return {"val_acc": score}

        def run(self) -> None:
            for score in scores:
                self.evaluate(score)

    class FitLoop(Loop):
        @hw.hookable
        def fit(self) -> None:
            self.run()

    loop = FitLoop() if fit else Loop()
    loop.checkpoint = ht.Checkpoint(tmp_path, monitor="val_acc", mode="max", save_top_k=2, save_last=False)
    loop.add_callback(loop.checkpoint)
    (loop.fit if fit else loop.run)()
    return loop


@pytest.mark.parametrize("fit", [True, False], ids=["with-fit", "without-fit"])
def test_top_k_keeps_the_best_of_several_evaluations_at_one_step(hw, ht, tmp_path, fit):
    # One name per (epoch, step): each evaluation replaced the last, and 0.7 was kept over 0.8.
    loop = _evaluations_at_one_step(hw, ht, tmp_path, [0.5, 0.9, 0.8, 0.7], fit)
    assert loop.checkpoint.top_k == [(0.9, 0, "best-epoch=0-step=0-v1.pt"), (0.8, 0, "best-epoch=0-step=0-v2.pt")]
    assert sorted(os.listdir(tmp_path)) == ["best-epoch=0-step=0-v1.pt", "best-epoch=0-step=0-v2.pt"]
    assert loop.checkpoint.best_path == tmp_path / "best-epoch=0-step=0-v1.pt"
    # Each written at the end of its evaluation, with or without fit: each holds its own weights.
    for name, score in (("best-epoch=0-step=0-v1.pt", 0.9), ("best-epoch=0-step=0-v2.pt", 0.8)):
        assert torch.load(tmp_path / name, weights_only=True)["model"]["weight"].item() == pytest.approx(score)
    # The names are the state's own: a resume reads them back, and "best" is the 0.9's file,
    # whose top-k is the one of its evaluation (0.8 came later; 0.5, evicted since, is dropped).
    saved = loop.checkpoint.resume(loop, "best")["callbacks"][loop.checkpoint.state_key]["top_k"]
    assert saved == [[0.9, 0, "best-epoch=0-step=0-v1.pt"], [0.5, 0, "best-epoch=0-step=0.pt"]]
    assert loop.model.weight.item() == pytest.approx(0.9)
    assert loop.checkpoint.top_k == [(0.9, 0, "best-epoch=0-step=0-v1.pt")]
    assert loop.checkpoint.best_path == tmp_path / "best-epoch=0-step=0-v1.pt"


def test_a_later_evaluation_at_one_step_takes_no_name_still_in_use(hw, ht, tmp_path):
    # 0.5 then 0.6 evicts it; a third at that step must not reuse a name whose file is
    # written, or is to be deleted after the next write.
    loop = _evaluations_at_one_step(hw, ht, tmp_path, [0.5, 0.6, 0.7, 0.4, 0.8], fit=False)
    assert [entry[:1] for entry in loop.checkpoint.top_k] == [(0.8,), (0.7,)]
    assert sorted(os.listdir(tmp_path)) == sorted(entry[2] for entry in loop.checkpoint.top_k)
    for value, _, name in loop.checkpoint.top_k:
        assert torch.load(tmp_path / name, weights_only=True)["model"]["weight"].item() == pytest.approx(value)


def test_a_nan_never_enters_the_top_k(hw, ht, tmp_path):
    loop = make_loop(hw, ht, [float("nan"), 0.5, float("nan")], dir=tmp_path, monitor="val_acc",
                     mode="max", save_last=False)
    loop.fit(3)
    assert os.listdir(tmp_path) == ["best-epoch=2-step=4.pt"]


def test_every_n_steps_and_epochs_keep_their_files_and_last_follows(hw, ht, tmp_path):
    loop = make_loop(hw, ht, [0.1] * 5, dir=tmp_path, every_n_steps=3, every_n_epochs=2)
    loop.fit(5)  # 10 steps
    assert sorted(os.listdir(tmp_path)) == ["epoch=2.pt", "epoch=4.pt", "last.pt", "step=3.pt",
                                            "step=6.pt", "step=9.pt"]
    counters = {name: (s["step"], s["epoch"]) for name in os.listdir(tmp_path)
                for s in [torch.load(tmp_path / name, weights_only=True)]}
    # A step's file is written at the end of that step: step 6, the last of the third
    # epoch, before that epoch is counted as completed.
    assert counters == {"step=3.pt": (3, 1), "step=6.pt": (6, 2), "step=9.pt": (9, 4),
                        "epoch=2.pt": (4, 2), "epoch=4.pt": (8, 4), "last.pt": (10, 5)}
    # last.pt, written at the end of fit, holds the final weights.
    assert torch.equal(torch.load(tmp_path / "last.pt", weights_only=True)["model"]["weight"],
                       loop.model.weight)


def test_writes_are_atomic(hw, ht, tmp_path, renames):
    loop = make_loop(hw, ht, [0.1, 0.2, 0.3], dir=tmp_path / "ckpt", monitor="val_acc", mode="max")
    loop.fit(3)
    assert renames and all(src == f".{dst}.{os.getpid()}.tmp" for src, dst in renames)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["best-epoch=3-step=6.pt", "last.pt"]  # no temporary left


def test_a_failed_write_leaves_the_previous_file_whole(hw, ht, tmp_path, monkeypatch):
    loop = make_loop(hw, ht, [0.1, 0.2], dir=tmp_path)
    loop.fit(1)
    before = (tmp_path / "last.pt").read_bytes()

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        loop.fit(1)
    assert os.listdir(tmp_path) == ["last.pt"] and (tmp_path / "last.pt").read_bytes() == before


def _files(folder: Any) -> dict[str, Any]:
    return {name: torch.load(folder / name, weights_only=True) for name in sorted(os.listdir(folder))}


def test_async_write_writes_the_same_files_from_another_thread(hw, ht, tmp_path, monkeypatch):
    """async_write=True, top-k and every-N: the same files with the same contents as
    the same run written in the training thread; each written by a background thread,
    after the save returned (a step ran before it ended)."""
    scores = [0.5, 0.7, 0.6, 0.9, 0.55, 0.8]
    settings = dict(monitor="val_acc", mode="max", save_top_k=2, every_n_steps=3)
    plain = make_loop(hw, ht, scores, dir=tmp_path / "plain", **settings)
    plain.fit(len(scores))
    writers: list[str] = []
    steps_while_writing: list[int] = []  # the loop's step count as step=3.pt's write ends
    io_class = importlib.import_module("hookwrap.torch.checkpoint_io").CheckpointIO
    write = io_class.write_atomically

    def slow_write(self: Any, path: Any, data: bytes) -> None:
        import threading
        import time

        writers.append(threading.current_thread().name)
        time.sleep(0.05)
        if path.name == "step=3.pt":  # the steps the loop made by the end of this write
            steps_while_writing.append(background.checkpoint.step)
        write(self, path, data)

    monkeypatch.setattr(io_class, "write_atomically", slow_write)
    background = make_loop(hw, ht, scores, dir=tmp_path / "background", async_write=True, **settings)
    background.fit(len(scores))
    assert _files(tmp_path / "background").keys() == _files(tmp_path / "plain").keys()
    for name, saved in _files(tmp_path / "background").items():
        theirs = _files(tmp_path / "plain")[name]
        assert saved["step"] == theirs["step"] and torch.equal(saved["model"]["weight"], theirs["model"]["weight"])
    assert background.checkpoint.top_k == plain.checkpoint.top_k
    assert writers and all(name.startswith("hookwrap Checkpoint(") for name in writers)
    assert steps_while_writing and steps_while_writing[0] > 3  # training went on while step=3.pt was written


def test_an_async_write_that_fails_is_raised_at_the_next_step_and_rolled_back(hw, ht, tmp_path, monkeypatch):
    loop = make_loop(hw, ht, [0.5, 0.7, 0.6], dir=tmp_path, monitor="val_acc", mode="max", save_last=False,
                     async_write=True)
    loop.fit(1)
    loop.checkpoint.wait_for_write()
    assert os.listdir(tmp_path) == ["best-epoch=1-step=2.pt"]
    io_class = importlib.import_module("hookwrap.torch.checkpoint_io").CheckpointIO

    def fail(self: Any, path: Any, data: bytes) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(io_class, "write_atomically", fail)
    with pytest.raises(hw.HookError, match=r"writing best-epoch=2-step=4\.pt \(step 4\) in the background failed: "
                                           r"OSError\('disk full'\)\. The files and the top-k are as at the last"):
        loop.fit(1)
    assert os.listdir(tmp_path) == ["best-epoch=1-step=2.pt"]
    assert loop.checkpoint.top_k == [(0.5, 2, "best-epoch=1-step=2.pt")]
    assert not loop.checkpoint._pending and not loop.checkpoint._evicted  # nothing left to write or delete


def test_async_write_without_fit_is_refused_naming_the_fix(hw, ht, tmp_path):
    """Without a fit join point nothing would wait for the last background write: its
    failure would go unheard."""
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            pass

    with pytest.raises(hw.HookError, match=r"async_write commits \(or raises\) its last background write when "
                                           r"fit ends, and the target has no 'fit'"):
        Loop().add_callback(ht.Checkpoint(tmp_path, model=torch.nn.Linear(1, 1), async_write=True))


def test_a_resume_that_fails_never_saves_over_the_file_it_resumes(hw, ht, tmp_path):
    """on_exception with resume_from: the file does not fit the model, the resume
    raises at the start of fit, and last.pt is left as it was (no save of the model
    that never trained over it)."""
    loop = make_loop(hw, ht, [0.1, 0.2], dir=tmp_path)
    loop.fit(1)
    before = (tmp_path / "last.pt").read_bytes()
    again = make_loop(hw, ht, [0.1], dir=tmp_path, on_exception=True, resume_from="last")
    again.model = torch.nn.Linear(3, 1)  # another shape: the file cannot be loaded into it
    with pytest.raises(hw.HookError, match=r"last\.pt"):
        again.fit(1)
    assert (tmp_path / "last.pt").read_bytes() == before and sorted(os.listdir(tmp_path)) == ["last.pt"]

def _recording_io(calls: list[tuple[str, Any]]) -> Any:
    """A CheckpointIO that records each call the policy makes through it."""
    base = importlib.import_module("hookwrap.torch.checkpoint_io").CheckpointIO

    class Recording(base):
        def save(self, checkpoint: Any, *paths: Any) -> None:
            calls.append(("save", [p.name for p in paths]))
            super().save(checkpoint, *paths)

        def load(self, path: Any, map_location: Any = None) -> Any:
            calls.append(("load", path.name))
            return super().load(path, map_location)

        def exists(self, path: Any) -> bool:
            calls.append(("exists", path.name))
            return bool(super().exists(path))

        def remove(self, path: Any) -> None:
            calls.append(("remove", path.name))
            super().remove(path)

    return Recording()


def test_the_policies_touch_their_files_only_through_their_checkpoint_io(hw, ht, tmp_path):
    # The seam another storage goes behind: every write, read, lookup and removal.
    calls: list[tuple[str, Any]] = []
    loop = make_loop(hw, ht, [0.1, 0.3, 0.2], dir=tmp_path / "run", monitor="val_acc", mode="max")
    loop.checkpoint.io = _recording_io(calls)
    loop.fit(3)
    loop.checkpoint.resume(loop, "best")
    best = "best-epoch=2-step=4.pt"
    assert calls == [("save", ["best-epoch=1-step=2.pt", "last.pt"]), ("save", [best, "last.pt"]),
                     ("remove", "best-epoch=1-step=2.pt"), ("save", ["last.pt"]), ("save", ["last.pt"]),
                     ("exists", best), ("load", best), ("exists", best)]
    assert sorted(os.listdir(tmp_path / "run")) == [best, "last.pt"]

    calls.clear()
    loop = make_loop(hw, ht, [0.1, 0.3, 0.2], dir=tmp_path / "unused")
    saver = ht.BestCheckpoint(tmp_path / "best.pt", monitor="val_acc", mode="max", restore_best=True)
    saver.io = _recording_io(calls)
    loop.add_callback(saver)
    loop.fit(3)
    assert calls == [("save", ["best.pt"]), ("save", ["best.pt"]), ("exists", "best.pt"), ("load", "best.pt")]


@pytest.mark.parametrize("setting, value, message", [
    ("save_top_k", 0, r"save_top_k must be a whole number >= 1, got 0"),
    ("every_n_steps", 0, r"every_n_steps must be a whole number >= 1, got 0"),
    ("every_n_epochs", 1.5, r"every_n_epochs must be a whole number >= 1, got 1.5"),
    ("save_last", "yes", r"save_last must be True or False, got 'yes'"),
    ("mode", "best", r"mode must be 'min' or 'max', got 'best'"),
    ("min_delta", -1.0, r"min_delta must be >= 0, got -1.0"),
    ("monitor", "", r"monitor must be the name of a value, or None, got ''"),
    ("resume_from", 3, r"resume_from must be 'last', 'best' or a file path, got 3"),
])
def test_bad_settings_raise_naming_the_setting(hw, ht, tmp_path, setting, value, message):
    kwargs = {"monitor": "val_loss", setting: value}
    with pytest.raises(hw.HookError, match=message):
        ht.Checkpoint(tmp_path, **kwargs)


def test_settings_the_target_cannot_serve_are_refused_when_attached(hw, ht, tmp_path):
    with pytest.raises(hw.HookError, match=r"save_top_k=3 keeps the best files by a monitored value"):
        ht.Checkpoint(tmp_path, save_top_k=3)
    loop = make_loop(hw, ht, [], dir=tmp_path)
    with pytest.raises(hw.UnknownEventError, match=r"'validate'"):
        loop.add_callback(ht.Checkpoint(tmp_path, monitor="val_acc", event="validate"))

    class NoFit(hw.Hookable):
        @hw.hookable
        def step(self) -> None: ...

    with pytest.raises(hw.HookError, match=r"resume_from restores at the start of fit"):
        NoFit().add_callback(ht.Checkpoint(tmp_path, resume_from="last"))
    with pytest.raises(hw.HookError, match=r"Loop has no attribute 'net' to read the model from"):
        broken = make_loop(hw, ht, [0.1], dir=tmp_path, model="net")
        broken.fit(1)


# --- under torch.distributed: 2 gloo ranks ----------------------------------------------


def test_resume_under_two_ranks_reaches_the_same_weights_and_stop(hw, tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    world, collective_timeout_s, deadline_s = 2, 20.0, 120
    flag = "" if hw.USING_EXTENSION else "1"
    results = run_ranks(worker.run, (world, str(tmp_path / "init"), str(tmp_path), flag, 40, collective_timeout_s),
                        world, deadline_s, tmp_path)
    for r in results:
        assert r["straight"]["stopped"] is not None
        assert r["resumed"]["weights"] == r["straight"]["weights"]  # exact floats, through JSON
        assert r["resumed"]["weights"] != r["killed"]["weights"]
        for key in ("stopped", "stop_epoch", "steps"):
            assert r["resumed"][key] == r["straight"][key]
        assert r["start_epoch"] == 6
    assert results[0]["resumed"]["weights"] == results[1]["resumed"]["weights"]  # DDP kept them in step
    assert results[0]["straight"]["stopped"] == results[1]["straight"]["stopped"]  # one decision
    # One writer: the files are rank 0's, with both ranks' RNG states.
    assert sorted(os.listdir(tmp_path / "killed")) == ["last.pt"]
    saved = torch.load(tmp_path / "killed" / "last.pt", weights_only=True)
    assert len(saved["rng"]) == 2 and not torch.equal(saved["rng"][0]["torch"], saved["rng"][1]["torch"])


def test_on_a_script_of_functions_files_are_written_at_once_and_resume(hw, ht, tmp_path):
    """A script like PyTorch's MNIST example: ``train(model, optimizer, epoch)`` and
    ``test(model)`` functions, no fit and no object: the model and optimizer are
    the functions' arguments, the scheduler is passed in, and with no fit to wait
    for each file is written when it is due."""
    import types

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scores = iter([0.5, 0.3, 0.4])

    @hw.hookable
    def train(model: Any, optimizer: Any, epoch: int) -> None:
        optimizer.zero_grad()
        model(torch.ones(3, 2)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()

    @hw.hookable
    def test(model: Any) -> float:
        return next(scores)

    script = types.ModuleType("script")
    script.train, script.test = train, test
    checkpoint = ht.Checkpoint(tmp_path, monitor="return_value", event="test", epoch_event="train",
                               scheduler=scheduler)
    hw.add_callback(script, checkpoint)
    for epoch in range(3):
        train(model, optimizer, epoch)
        test(model)
        assert torch.equal(torch.load(tmp_path / "last.pt", weights_only=True)["model"]["weight"],
                           model.weight)  # written after the epoch, not at the next one
    assert sorted(os.listdir(tmp_path)) == ["best-epoch=2-step=0.pt", "last.pt"]
    saved = torch.load(tmp_path / "best-epoch=2-step=0.pt", weights_only=True)
    assert saved["epoch"] == 2 and saved["scheduler"]["last_epoch"] == 2
    trained = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    state = checkpoint.resume(None)
    assert state["epoch"] == 3 and scheduler.last_epoch == 3 and torch.equal(model.weight, trained)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: resume onto the GPU, its RNG restored")
def test_resume_onto_cuda_restores_weights_and_the_cuda_rng(hw, ht, tmp_path):
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(2, 1).cuda()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.1)

        @hw.hookable
        def fit(self, epochs: int) -> None:
            for index in range(epochs):
                self.epoch(index)

        @hw.hookable
        def epoch(self, index: int) -> None:
            self.optimizer.zero_grad()
            self.model(torch.rand(4, 2, device="cuda")).pow(2).mean().backward()
            self.optimizer.step()

    first = Loop()
    first.add_callback(ht.Checkpoint(tmp_path))
    first.fit(2)
    after = torch.rand(3, device="cuda")  # the next draw of the CUDA RNG after the run
    again = Loop()
    checkpoint = ht.Checkpoint(tmp_path)
    again.add_callback(checkpoint)
    checkpoint.resume(again)
    assert again.model.weight.device.type == "cuda"
    assert torch.equal(again.model.weight, first.model.weight)
    assert torch.equal(torch.rand(3, device="cuda"), after)
    assert next(iter(again.optimizer.state.values()))["exp_avg"].device.type == "cuda"


def test_the_example_trainer_resumes_exactly_with_its_dataloader_generator(hw, ht, tmp_path):
    """examples/trainer.py shuffles with a DataLoader's own ``generator=``: not a
    global RNG, so it is named in ``generators=``. Resumed after 2 of 4 epochs, its
    weights are those of the run that went straight through; without the generator
    they are not (the data order differs)."""
    from hookwrap.examples.trainer import make_run

    def session(folder: str, with_generator: bool = True) -> Any:
        trainer = make_run(batch_size=256)
        generators = [trainer.train_loader.generator] if with_generator else []
        trainer.add_callback(ht.EarlyStopping("val_loss", patience=3))
        trainer.checkpoint = ht.Checkpoint(folder, monitor="val_loss", generators=generators)
        trainer.add_callback(trainer.checkpoint)
        return trainer

    def continue_(trainer: Any, epochs: int) -> None:
        state = trainer.checkpoint.resume(trainer)
        for index in range(state["epoch"], epochs):  # the rest of fit's loop
            trainer.epoch(index, trainer.train_loader)
            trainer.evaluate(trainer.val_loader)

    straight = session(str(tmp_path / "straight"))
    straight.fit(4)
    for with_generator in (True, False):
        folder = str(tmp_path / f"resumed-{with_generator}")
        session(folder, with_generator).fit(2)
        resumed = session(folder, with_generator)
        continue_(resumed, 4)
        assert _same_weights(resumed, straight) is with_generator
    with pytest.raises(hw.HookError, match=r"holds the state of 1 generator\(s\), and generators= names 0"):
        bad = session(str(tmp_path / "resumed-True"), with_generator=False)
        bad.checkpoint.resume(bad)
    with pytest.raises(hw.HookError, match=r"generators must be a list of torch.Generator"):
        ht.Checkpoint(tmp_path, generators=[1])


def test_best_resumes_in_a_new_process_from_what_last_recorded(hw, ht, tmp_path):
    scores = [0.5, 0.9, 0.6]
    loop = make_loop(hw, ht, scores, dir=tmp_path, monitor="val_acc", mode="max", save_top_k=2)
    loop.fit(len(scores))
    fresh = make_loop(hw, ht, scores, dir=tmp_path, monitor="val_acc", mode="max", save_top_k=2)
    assert fresh.checkpoint.top_k == []  # a new process knows no top-k yet
    assert fresh.checkpoint.resume(fresh, "best")["step"] == 4  # evaluation 2, read from last.pt
    assert torch.equal(fresh.model.weight, loop.weights_at[2])


def test_a_run_resumes_from_another_folder_or_the_same_one_spelt_otherwise(hw, ht, tmp_path, monkeypatch):
    scores = [0.5, 0.9, 0.6]
    loop = make_loop(hw, ht, scores, dir=tmp_path / "run1")
    loop.fit(len(scores))
    moved = make_loop(hw, ht, scores, dir=tmp_path / "run2")
    assert moved.checkpoint.resume(moved, tmp_path / "run1" / "last.pt")["step"] == 6
    assert moved.checkpoint.step == 6 and torch.equal(moved.model.weight, loop.model.weight)
    monkeypatch.chdir(tmp_path)
    relative = make_loop(hw, ht, scores, dir="run1")
    assert relative.checkpoint.state_key == loop.checkpoint.state_key
    assert relative.checkpoint.resume(relative)["step"] == 6


def test_a_resume_that_cannot_load_changes_nothing(hw, ht, tmp_path):
    scores = [0.5, 0.9]
    loop = make_loop(hw, ht, scores, dir=tmp_path)
    loop.fit(len(scores))
    other = make_loop(hw, ht, scores, dir=tmp_path)
    other.model = torch.nn.Linear(3, 1)  # another model: its weights cannot load
    before = other.model.weight.detach().clone()
    with pytest.raises(hw.HookError, match=r"holds weights of another model \(other shapes for weight\); "
                                           r"nothing was restored"):
        other.checkpoint.resume(other)
    assert torch.equal(other.model.weight, before) and other.checkpoint.step == 0


def test_resumed_from_an_earlier_file_top_k_names_only_files_on_disk(hw, ht, tmp_path):
    scores = [0.5, 0.9, 0.6, 0.95]  # mode max, top 1: evaluation 2's file is evicted by 4's
    loop = make_loop(hw, ht, scores, dir=tmp_path, monitor="val_acc", mode="max", every_n_epochs=1)
    loop.fit(len(scores))
    earlier = make_loop(hw, ht, scores, dir=tmp_path, monitor="val_acc", mode="max", every_n_epochs=1)
    earlier.checkpoint.resume(earlier, tmp_path / "epoch=2.pt")  # its top-k named evaluation 2's file
    assert all((tmp_path / name).is_file() for _, _, name in earlier.checkpoint.top_k)
    assert earlier.checkpoint.top_k == []  # that file is gone: the next evaluation takes its place
