"""torch.distributed: the shipped callbacks decide together when the ranks disagree.

Two CPU processes on gloo, a DDP model in a hookable loop
(tests/torch/_distributed_decisions_worker.py). A rank that stops alone would leave the
other waiting in DDP's next gradient all-reduce: the process group's timeout turns
that into an error in the worker and a failed test, and the join deadline here
catches anything else that hangs."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch has no gloo backend", allow_module_level=True)

from tests.torch import _distributed_decisions_worker as worker
from tests._ranks import run_ranks

WORLD = 2
COLLECTIVE_TIMEOUT_S = 20.0  # a collective some rank never joins fails after this
DEADLINE_S = 90  # the whole run, spawning included


def _run(hw, tmp_path, scenario):
    flag = "" if hw.USING_EXTENSION else "1"
    return run_ranks(worker.run, (WORLD, str(tmp_path / "init"), str(tmp_path), flag, scenario,
                                  COLLECTIVE_TIMEOUT_S), WORLD, DEADLINE_S, tmp_path)


def test_early_stopping_stops_every_rank_at_the_same_evaluation(hw, tmp_path):
    results = _run(hw, tmp_path, "early_stopping")
    # Alone, rank 0 would stop at evaluation 3 and rank 1 at 5: the mean (2.5, 2.5,
    # 2.0, 1.95, 1.95, 1.95) stops both at 6, after as many DDP steps.
    assert [r["evaluations"] for r in results] == [6, 6]
    assert [r["steps"] for r in results] == [12, 12]
    for r in results:
        assert r["stopped"].startswith("StopTraining: EarlyStopping: val_loss has not improved")
        assert "(best 1.95 at step 8, now 1.95)" in r["stopped"]
    assert results[0]["restored"] == pytest.approx(results[1]["restored"])  # DDP kept them in step


@pytest.mark.parametrize("scenario", ["nan", "nan_deferred"])
def test_nan_on_one_rank_stops_every_rank_at_that_step(hw, tmp_path, scenario):
    results = _run(hw, tmp_path, scenario)
    # sync=True: in the bad step itself. Deferred (check_every=4): at the read-back
    # before step 9, on both ranks, with one all-reduce; the message names step 7.
    stopped_after = worker.NAN_STEP if scenario == "nan" else 8
    assert [r["steps"] for r in results] == [stopped_after] * WORLD
    bad, good = results[worker.NAN_RANK], results[1 - worker.NAN_RANK]
    assert bad["stopped"].startswith(
        f"NonFiniteError: NanGuard: event 'post-loss' returned nan at step {worker.NAN_STEP} "
        f"on rank {worker.NAN_RANK} (Loop).")
    assert good["stopped"].startswith(
        f"NonFiniteError: NanGuard: event 'post-loss' returned NaN or infinite at step "
        f"{worker.NAN_STEP} on rank {worker.NAN_RANK} (finite on this rank, "
        f"{1 - worker.NAN_RANK}) (Loop).")


def test_best_checkpoint_one_writer_every_rank_restores(hw, tmp_path):
    results = _run(hw, tmp_path, "best_checkpoint")
    # The mean (1.0, 1.25, 0.7, 0.9, 0.9) is best at evaluation 3; rank 0 alone
    # would have kept evaluation 2.
    assert [r["saved"] for r in results] == [2, 0]  # evaluations 1 and 3, by rank 0
    assert [r["best"] for r in results] == [pytest.approx(0.7)] * WORLD
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "init") == [
        "best.pt", "rank-0.json", "rank-1.json"]  # one checkpoint, no temporary left
    for r in results:
        assert r["evaluations"] == 5
        assert r["restored"] == pytest.approx(r["weights"][2])  # evaluation 3's weights
        assert r["file"] == pytest.approx(r["weights"][2])
        assert r["weights"][2] != pytest.approx(r["weights"][4])  # training moved on after it


@pytest.mark.parametrize("scenario", ["spike", "spike_stop"])
def test_a_spike_on_one_rank_stops_every_rank_at_the_same_step(hw, tmp_path, scenario):
    results = _run(hw, tmp_path, scenario)
    # check_every=4: decided at the read-back before step 9 (one all-reduce), after
    # step 8 on both ranks; check_every=1: before step 8.
    stopped_after = 7 if scenario == "spike_stop" else 8
    assert [r["steps"] for r in results] == [stopped_after] * WORLD
    bad, good = results[worker.SPIKE_RANK], results[1 - worker.SPIKE_RANK]
    kind = "StopTraining" if scenario == "spike_stop" else "TrainingSpikeError"
    assert bad["stopped"].startswith(f"{kind}: SpikeDetection: the loss spiked at step {worker.SPIKE_STEP}: ")
    assert good["stopped"] == (f"{kind}: SpikeDetection: the loss spiked on rank {worker.SPIKE_RANK} "
                               f"(not on this one).")
    if scenario == "spike":
        assert bad["spike_step"] == worker.SPIKE_STEP and bad["bad_steps"] == [6, 7]
        assert good["bad_steps"] == []  # no spike of its own
    assert results[0]["restored"] == pytest.approx(results[1]["restored"])  # DDP kept them in step


def test_a_time_budget_spent_on_one_rank_stops_every_rank_at_the_same_step(hw, tmp_path):
    results = _run(hw, tmp_path, "time_limit")
    # Rank 1 (10 s a step) reaches 55 s after step 6; rank 0 (1 s a step) would
    # alone go on to step 55: both stop after step 6, at the same check.
    assert [r["steps"] for r in results] == [6, 6]
    assert results[1]["stopped"] == ("StopTraining: TimeLimit: the time limit of 0:00:55 is reached "
                                     "(60.0 s trained); stopping the run.")
    assert results[0]["stopped"] == ("StopTraining: TimeLimit: the time limit of 0:00:55 is reached on rank 1 "
                                     "(not on this one) (6.0 s trained); stopping the run.")
    assert results[0]["restored"] == pytest.approx(results[1]["restored"])
