"""``hookwrap run`` resuming a module-level loop from a ``Checkpoint`` file: the script
replays its first steps without their updates, the checkpoint is loaded right after
the saved one, and the run goes on as the run that was never stopped (weights,
losses printed, CSV rows, the script's own files)."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")

# 8 batches an epoch, 3 epochs: 24 updates. Dropout and a shuffling DataLoader draw
# random numbers each step, an LR scheduler steps each epoch, and the script saves a
# file of its own after its 5th update (through an open file, as word_language_model does).
LOOP = """
    import argparse, io, os, signal
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    data = torch.randn(64, 4)
    target = data.sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(data, target), batch_size=8, shuffle=True)
    def evaluate():
        with torch.no_grad():
            return torch.nn.functional.mse_loss(model(data), target).item()
    it = 0
    print("model built")
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            print(f"iter {it}: loss {loss.item():.6f}")
            optimizer.zero_grad()
            loss.backward()
            if it == args.kill_at:
                os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's preemption, mid-step
            if it == args.raise_at:
                raise RuntimeError("the node failed")
            optimizer.step()
            it += 1
            if it == 5:
                with open(os.path.join(args.out, "own.pt"), "wb") as f:
                    torch.save(model.state_dict(), f)
            if it == 7:  # a copy through a buffer, read back: written as asked, in the replay too
                buffer = io.BytesIO()
                torch.save(model.state_dict(), buffer)
                buffer.seek(0)
                assert torch.load(buffer).keys() == model.state_dict().keys()
        scheduler.step()
        print(f"epoch {epoch}: val {evaluate():.6f}")
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
"""
CHECKPOINT = "Checkpoint({dir!r}, on_signal='SIGTERM', on_exception=True, model='__main__:model', " \
             "optimizer='__main__:optimizer', scheduler='__main__:scheduler'{more})"


def _runner() -> Any:
    return importlib.import_module("hookwrap._script_runner")


def _script(tmp_path: Path, body: str = LOOP) -> Path:
    path = tmp_path / "loop.py"
    path.write_text(textwrap.dedent(body))
    return path


def _hookwrap_run(hw: Any, tmp_path: Path, out: Path, *script_args: str, resume: str = "") -> \
        subprocess.CompletedProcess[str]:
    """The loop under ``python -m hookwrap run``, a Checkpoint in ``tmp_path/ck``, its
    losses and evaluations logged into ``out/metrics.csv``, EarlyStopping keeping state."""
    out.mkdir(exist_ok=True)
    more = f", resume_from={resume!r}" if resume else ""
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1")
    command = [sys.executable, "-m", "hookwrap", "run", "--preset", "torch_optim",
               "--weave", "loss=torch.nn.functional:mse_loss", "--train-only", "loss",
               "--weave", "evaluate=__main__:evaluate",
               "--callback", CHECKPOINT.format(dir=str(tmp_path / "ck"), more=more),
               "--callback", "EarlyStopping('return_value', patience=100)",
               "--callback", f"MetricsLogger({str(out / 'metrics.csv')!r}, tensorboard=False)",
               str(_script(tmp_path)), "--out", str(out), *script_args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _equal_weights(a: Path, b: Path) -> bool:
    first, second = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize(("stop", "resume", "status"), [("--kill-at", "signal", -signal.SIGTERM),
                                                         ("--raise-at", "exception", 1)])
def test_a_run_stopped_mid_epoch_resumes_to_the_uninterrupted_runs_weights_and_rows(hw, tmp_path, stop, resume,
                                                                                      status):
    """SIGTERM during update 11 (signal.pt after it), or an exception before update 14
    (exception.pt after update 13), then the same command with resume_from: the final
    weights are torch.equal to the run never stopped, as are its CSV (losses, the
    evaluations, at their steps) and its printed lines from the resumed step on; the
    file the script saved after update 5 is the stopped run's, not overwritten by the
    replay with weights that never trained."""
    straight = _hookwrap_run(hw, tmp_path, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    at = 10 if resume == "signal" else 13
    stopped = _hookwrap_run(hw, tmp_path, tmp_path / "run", stop, str(at))
    # a signal handed on ends the process by it (or 128 + it, where Python had no handler before)
    assert stopped.returncode in (status, 128 + signal.SIGTERM) if resume == "signal" else stopped.returncode == 1, \
        stopped.stderr
    saved_step = 11 if resume == "signal" else 13
    own = torch.load(tmp_path / "run" / "own.pt", weights_only=True)
    resumed = _hookwrap_run(hw, tmp_path, tmp_path / "run", resume=resume)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {tmp_path / 'ck' / (resume + '.pt')} at step {saved_step}" in resumed.stderr
    assert _equal_weights(tmp_path / "straight" / "final.pt", tmp_path / "run" / "final.pt")
    replayed = torch.load(tmp_path / "run" / "own.pt", weights_only=True)
    assert all(torch.equal(own[k], replayed[k]) for k in own)
    assert _equal_weights(tmp_path / "straight" / "own.pt", tmp_path / "run" / "own.pt")
    assert (tmp_path / "run" / "metrics.csv").read_text() == (tmp_path / "straight" / "metrics.csv").read_text()
    # What the script prints before its first update is the same in both runs, and shown;
    # from there to the step after the saved one it is held off (what the saved step
    # printed may be its replayed forward's), and said.
    lines = straight.stdout.splitlines()
    resumed_at = next(i for i, line in enumerate(lines) if line.startswith(f"iter {saved_step}:"))
    assert resumed.stdout.splitlines() == lines[:2] + lines[resumed_at + 1:]
    assert "1 line the script printed between the saved step and the next held off too" in resumed.stderr
    assert lines[:2] == ["model built", lines[1]] and lines[1].startswith("iter 0: loss")


def test_without_the_replay_the_same_resume_would_differ(hw, tmp_path):
    """The check above can fail: a run whose replay is cut short (resumed at step 11 from
    a file of step 6's) ends with other weights."""
    straight = _hookwrap_run(hw, tmp_path, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    _hookwrap_run(hw, tmp_path, tmp_path / "run", "--kill-at", "5")
    resumed = _hookwrap_run(hw, tmp_path, tmp_path / "run", resume="signal")
    assert resumed.returncode == 0 and "at step 6" in resumed.stderr, resumed.stderr
    assert _equal_weights(tmp_path / "straight" / "final.pt", tmp_path / "run" / "final.pt")
    ck = tmp_path / "ck" / "signal.pt"
    state = torch.load(ck, weights_only=True)
    state["step"] = 4  # the weights of step 6 put back after 4 steps: 2 updates too many
    torch.save(state, ck)
    wrong = _hookwrap_run(hw, tmp_path, tmp_path / "run", resume="signal")
    assert wrong.returncode == 0 and "at step 4" in wrong.stderr, wrong.stderr
    assert not _equal_weights(tmp_path / "straight" / "final.pt", tmp_path / "run" / "final.pt")


# --- refused before the script runs ------------------------------------------------------------


def _saved_signal(tmp_path: Path, steps: int = 3) -> None:
    """A signal.pt as the run that was stopped after ``steps`` updates saved it."""
    checkpoint = importlib.import_module("hookwrap.torch").Checkpoint
    cb = checkpoint(str(tmp_path / "ck"), model=torch.nn.Linear(4, 1), optimizer=None)
    cb.run_state = importlib.import_module("hookwrap._script_replay").RunState([cb])  # as hookwrap run sets it
    cb.step = steps
    cb._pending.add("signal.pt")
    cb._write(None)


@pytest.mark.parametrize(("options", "message"), [
    # An event name of its own: join points of earlier tests named "step" may be alive still.
    (dict(callback="Checkpoint('ck', resume_from='signal', model='__main__:model', optimizer=None, "
                   "step_event='replayed_step')"), r"no join point is 'replayed_step'\. Add --preset torch_optim"),
    (dict(callback="Checkpoint('ck', resume_from='signal', optimizer=None)"),
     r"model='model' is read from the run's join point.*model='__main__:model'"),
    (dict(state="s.pt"), r"resume_from and --state s\.pt both resume the callbacks"),
    (dict(callback="Checkpoint('nothing', resume_from='signal', model='__main__:model', optimizer=None)"),
     r"no checkpoint to resume from at '.*nothing/signal\.pt'"),
    (dict(extra=["EarlyStopping('return_value')"]),
     r"holds the state of 'Checkpoint\[.*\]', and this run's callbacks are 'Checkpoint\[.*\]', "
     r"'EarlyStopping\[monitor=return_value,mode=min\]'\. Resume with the --callback options"),
])
def test_a_resume_that_cannot_work_is_refused_before_the_script_runs(hw, tmp_path, capsys, monkeypatch, options,
                                                                   message):
    monkeypatch.chdir(tmp_path)
    _saved_signal(tmp_path)
    probe = _script(tmp_path, "print('ran')\ndef evaluate():\n    return 1.0\n")
    callback = options.get("callback", "Checkpoint('ck', resume_from='signal', model='__main__:model', "
                                       "optimizer=None)")
    status = _runner().run(str(probe), [], presets=options.get("presets", ["torch_optim"]),
                           weaves=["evaluate=__main__:evaluate"], callbacks=[callback, *options.get("extra", [])],
                           state=options.get("state"))
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and re.search(message, err), err


THREE_STEPS = """
    import torch
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.step()
    print("done")
"""

def test_a_script_that_ends_before_the_saved_step_is_said(hw, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _saved_signal(tmp_path, steps=5)
    probe = _script(tmp_path, THREE_STEPS)
    save, stdout = torch.save, sys.stdout
    status = _runner().run(str(probe), [], presets=["torch_optim"],
                           callbacks=["Checkpoint('ck', resume_from='signal', model='__main__:model', optimizer=None)"])
    assert torch.save is save and sys.stdout is stdout  # what the replay held off is put back
    out, err = capsys.readouterr()
    assert status == 2 and out == "", err  # its output from the first step on was held off
    assert "was saved after step 5, and the script ended after 3: it could not be replayed" in err


def test_resume_from_last_with_nothing_saved_starts_afresh_and_says_so(hw, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    probe = _script(tmp_path, THREE_STEPS)
    status = _runner().run(str(probe), [], presets=["torch_optim"],
                           callbacks=["Checkpoint('ck', resume_from='last', model='__main__:model', "
                                      "optimizer='__main__:optimizer')"])
    out, err = capsys.readouterr()
    assert status == 0 and out == "done\n", err
    assert "no last checkpoint saved yet: the run starts afresh" in err
    assert torch.load(tmp_path / "ck" / "last.pt", weights_only=True)["step"] == 3

