"""hookwrap.torch's decisions in one process: the public helpers (any_rank,
ranks_where, all_ranks_mean) communicate nothing without a process group, and
exactly one all-reduce per decision with one; BestCheckpoint restores onto the
model's device; GradNorm's fallback for torch without get_total_norm (< 2.6).
Two ranks that disagree: tests/torch/test_distributed_decisions.py."""

from __future__ import annotations

import importlib
import math
import sys

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
import torch.distributed as dist  # noqa: E402

from tests.torch.test_callbacks import make_loop  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice


@pytest.fixture
def collectives(monkeypatch):
    """The all-reduces run, as (op, values before) pairs; is_initialized's calls."""
    log = {"all_reduce": [], "is_initialized": 0}
    real_all_reduce, real_is_initialized = dist.all_reduce, dist.is_initialized

    def all_reduce(tensor, op=dist.ReduceOp.SUM, *args, **kwargs):
        log["all_reduce"].append((op, tensor.tolist()))
        return real_all_reduce(tensor, op, *args, **kwargs)

    def is_initialized(*args, **kwargs):
        log["is_initialized"] += 1
        return real_is_initialized(*args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "is_initialized", is_initialized)
    return log


@pytest.fixture
def one_rank_group(tmp_path):
    """A real gloo process group of one rank, in this process. init_process_group
    replaces sys.excepthook (to prefix "[rank0]: "): put it back after."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    hook = sys.excepthook
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def _run_callbacks(hw, ht, tmp_path, losses, scores):
    loop = make_loop(hw, losses=losses, scores=scores)
    guard = ht.NanGuard()
    stopper = ht.EarlyStopping("val_loss", patience=1)
    saver = ht.BestCheckpoint(tmp_path / "best.pt", restore_best=True)
    for cb in (guard, stopper, saver):
        loop.add_callback(cb)
    return loop, guard, stopper, saver


def test_helpers_without_a_process_group_communicate_nothing(hw, ht, collectives):
    assert not dist.is_initialized() and not ht.is_distributed()
    assert ht.any_rank(True) is True and ht.any_rank(False) is False
    assert ht.ranks_where(True) == [0] and ht.ranks_where(False) == []
    assert ht.all_ranks_mean(2.5) == 2.5 and math.isnan(ht.all_ranks_mean(math.nan))
    assert collectives["all_reduce"] == []


def test_shipped_decisions_without_a_process_group_check_once_and_communicate_nothing(
        hw, ht, tmp_path, collectives):
    loop, guard, stopper, saver = _run_callbacks(hw, ht, tmp_path, [1.0] * 6,
                                                 [(0.9, 0), (0.5, 0), (0.7, 0)])
    collectives["is_initialized"] = 0
    loop.fit(3)
    assert loop.stop_reason is not None and "has not improved" in loop.stop_reason
    assert guard.checked == 6 and saver.saved == 2
    # One check per decision: NanGuard's read-back at the end of each epoch (3: its
    # checks are queued, not decided, in each step); each evaluation for EarlyStopping
    # (3) and for BestCheckpoint (3: EarlyStopping, attached first, stops the run in
    # the third, after the event's other callbacks ran). Each save asks twice (is it
    # rank 0, then the barrier), the restore once.
    assert collectives["is_initialized"] == 3 + 3 + 3 + 2 * 2 + 1
    assert collectives["all_reduce"] == []


def test_helpers_in_a_process_group_reduce_once_each(hw, ht, collectives, one_rank_group):
    assert ht.is_distributed()
    assert ht.any_rank(True) is True and ht.ranks_where(True) == [0]
    assert ht.ranks_where(False) == [] and ht.all_ranks_mean(2.5) == 2.5
    assert collectives["all_reduce"] == [(dist.ReduceOp.MAX, [1]), (dist.ReduceOp.SUM, [1]),
                                         (dist.ReduceOp.SUM, [0]), (dist.ReduceOp.SUM, [2.5])]


def test_shipped_decisions_in_a_process_group_reduce_once_per_decision(
        hw, ht, tmp_path, collectives, one_rank_group):
    loop, guard, stopper, saver = _run_callbacks(hw, ht, tmp_path, [1.0] * 6,
                                                 [(0.9, 0), (0.5, 0), (0.7, 0)])
    loop.fit(3)
    assert "has not improved" in loop.stop_reason and saver.saved == 2
    reduced = [values for _, values in collectives["all_reduce"]]
    # Per epoch one NanGuard read-back of its two steps' checks ([0]: no non-finite
    # step on rank 0); per evaluation one mean for each monitor (EarlyStopping stops
    # the run in the third, raised after BestCheckpoint read it too: no save, 0.7 is
    # not better), after each save the barrier ([0]: the write did not fail), at the
    # end one "can every rank read the file" ([1]).
    step = [[0]]
    assert reduced == (step + [[0.9], [0.9], [0]] + step + [[0.5], [0.5], [0]] + step
                       + [[0.7], [0.7]] + [[1]])
    assert torch.equal(loop.model.weight, torch.load(tmp_path / "best.pt", weights_only=True)["model"]["weight"])


def test_nan_guard_in_a_process_group_names_the_rank(hw, ht, tmp_path, one_rank_group):
    loop, *_ = _run_callbacks(hw, ht, tmp_path, [1.0, 1.0, math.nan], [(0.9, 0), (0.5, 0)])
    with pytest.raises(ht.NonFiniteError, match=r"returned nan at step 3 on rank 0 \(Loop\)\. "):
        loop.fit(2)


def test_best_checkpoint_restores_onto_the_models_device(hw, ht, tmp_path, monkeypatch):
    loop, _, _, saver = _run_callbacks(hw, ht, tmp_path, [1.0] * 4, [(0.9, 0), (0.5, 0)])
    loads = []
    real_load = torch.load

    def load(*args, **kwargs):
        loads.append(kwargs.get("map_location"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    loop.fit(2)
    assert loads == [loop.model.weight.device] == [torch.device("cpu")]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, math.inf])
def test_grad_norm_falls_back_where_torch_lacks_get_total_norm(hw, ht, monkeypatch, norm_type):
    monitors = importlib.import_module("hookwrap.torch.monitors")
    torch.manual_seed(0)
    grads = [torch.randn(3, 4), torch.randn(5), torch.randn(()), torch.randn(2, 2, 2) * 10]
    real = torch.nn.utils.get_total_norm(grads, norm_type)
    assert monitors.total_norm(grads, norm_type) is not None
    monkeypatch.delattr(torch.nn.utils, "get_total_norm")
    fallback = monitors.total_norm(grads, norm_type)
    assert fallback.dim() == 0 and float(fallback) == pytest.approx(float(real), rel=1e-6)

    # GradNorm itself, on the fallback: the same norms as with get_total_norm.
    def norms():
        torch.manual_seed(0)
        loop = make_loop(hw, losses=[1.0] * 4, scores=[(0.5, 0)] * 2)
        measured = ht.GradNorm(norm_type=norm_type)
        loop.add_callback(measured)
        loop.fit(2)
        return measured.history

    fallback_history = norms()
    monkeypatch.undo()
    real_history = norms()
    assert [step for step, _ in fallback_history] == [step for step, _ in real_history] == [1, 2, 3, 4]
    assert [n for _, n in fallback_history] == pytest.approx([n for _, n in real_history], rel=1e-6)
