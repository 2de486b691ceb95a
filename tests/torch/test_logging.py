"""hookwrap's own record (``logging.getLogger("hookwrap")``: saves, restores,
resumes, decisions to stop, at INFO, quiet by default), and a ``logging.Logger``
taken wherever a callback takes a logger."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")

from tests.torch.test_callbacks import make_loop  # noqa: E402  (each step's loss, each evaluation's scores scripted)


def test_a_logging_logger_gets_an_info_record_a_step_with_the_numbers(hw, ht, caplog):
    caplog.set_level(logging.INFO, logger="hwtest")
    losses = [0.5, 0.25, 0.125, 0.0625]
    loop = make_loop(hw, losses, [(1.0, 0.0)] * 2)
    metrics = ht.MetricsLogger(loggers=[logging.getLogger("hwtest.rows")])
    norms = ht.GradNorm(logger=logging.getLogger("hwtest.norms"))  # a callback's logger= too
    loop.add_callback(metrics)
    loop.add_callback(norms)
    loop.fit(2)
    rows = [(r.step, r.metrics) for r in caplog.records if r.name == "hwtest.rows"]
    assert [(step, m["loss"]) for step, m in rows if "loss" in m] == list(enumerate(losses, 1))
    assert all(r.levelno == logging.INFO and r.getMessage().startswith(f"step {r.step}: ")
               for r in caplog.records if r.name.startswith("hwtest"))
    seen = [(r.step, r.metrics["grad_norm"]) for r in caplog.records if r.name == "hwtest.norms"]
    assert [step for step, _ in seen] == [1, 2, 3, 4] and all(norm > 0 for _, norm in seen)
    assert seen == [(step, pytest.approx(value)) for step, value in norms.history]
    clone = pickle.loads(pickle.dumps(metrics))  # a logging.Logger pickles by its name
    assert clone.loggers[0].logger is logging.getLogger("hwtest.rows")


def test_hookwrap_records_its_saves_restores_resumes_and_stops(hw, ht, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hookwrap")
    loop = make_loop(hw, [], [(v, 0.0) for v in (1.0, 0.5, 0.75, 0.8, 0.9)])
    checkpoint = ht.Checkpoint(tmp_path / "ckpt", monitor="val_loss")
    best = ht.BestCheckpoint(tmp_path / "best.pt", monitor="val_loss", restore_best=True)
    for callback in (checkpoint, best, ht.EarlyStopping("val_loss", patience=2)):
        loop.add_callback(callback)
    loop.fit(5)
    assert loop.stop_reason.startswith("EarlyStopping")
    said = [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("hookwrap")]
    assert ("hookwrap.torch.early_stopping", "stopping at step 8: EarlyStopping: val_loss has not improved "
            "by more than 0.0 for 2 evaluations (best 0.5 at step 4, now 0.8).") in said
    assert [m for n, m in said if n == "hookwrap.torch.checkpoint" and "saved the best" in m] == [
        f"BestCheckpoint({str(tmp_path / 'best.pt')!r}): saved the best val_loss so far, {v}, at step {s}"
        for v, s in (("1", 2), ("0.5", 4))]
    assert any("saved last.pt" in m for n, m in said if n == "hookwrap.torch.checkpoint")
    assert any("restored the best weights (val_loss 0.5, step 4)" in m for _, m in said)
    saved = torch.load(tmp_path / "ckpt" / "last.pt", weights_only=False)  # the run stopped at step 8
    assert (saved["step"], saved["epoch"]) == (8, 4)
    caplog.clear()
    again = make_loop(hw, [], [(1.0, 0.0)] * 5)
    again.add_callback(ht.Checkpoint(tmp_path / "ckpt", monitor="val_loss", resume_from="last"))
    again.add_callback(ht.BestCheckpoint(tmp_path / "best.pt", monitor="val_loss", restore_best=True))
    again.add_callback(ht.EarlyStopping("val_loss", patience=2))
    again.fit(1)
    resumed = [r.getMessage() for r in caplog.records if "resumed from" in r.getMessage()]
    assert resumed == [f"Checkpoint({str(tmp_path / 'ckpt')!r}): resumed from "
                       f"{tmp_path / 'ckpt' / 'last.pt'} at step 8, epoch 4"]


def test_hookwrap_is_quiet_by_default():
    """Nothing configured: the "hookwrap" logger says nothing below WARNING, so a run
    with checkpoints and an early stop prints nothing of it."""
    code = ("import logging, hookwrap, hookwrap.torch; "
            "print(logging.getLogger('hookwrap').getEffectiveLevel(), "
            "logging.getLogger('hookwrap.torch.checkpoint').isEnabledFor(logging.INFO))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(logging.WARNING), "False"] and out.stderr == ""
