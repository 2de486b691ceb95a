"""torch.distributed: two CPU processes on the gloo backend, a DDP model in a
hookable loop (tests/torch/_distributed_worker.py). Callbacks fire on every rank; a
``rank_zero_only=True`` registration and the shipped callbacks that print or write
act on rank 0 alone; a slow rank-0 callback deadlocks nobody; all shut down."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch has no gloo backend", allow_module_level=True)

from tests.torch import _distributed_worker
from tests._ranks import run_ranks

WORLD = 2
DEADLINE_S = 180


def test_callbacks_on_every_rank_and_on_rank_zero_only(hw, tmp_path):
    flag = "" if hw.USING_EXTENSION else "1"
    results = run_ranks(_distributed_worker.run, (WORLD, str(tmp_path / "init"), str(tmp_path), flag),
                        WORLD, DEADLINE_S, tmp_path)
    assert all(r["compiled"] == hw.USING_EXTENSION for r in results)
    assert [r["counts"]["every rank"] for r in results] == [10, 10]
    assert [r["counts"]["rank zero only"] for r in results] == [10, 0]
    assert results[0]["weight"] == pytest.approx(results[1]["weight"])  # DDP kept them in step
    assert "epoch 2: 100%" in (tmp_path / "bar-0.txt").read_text()
    assert (tmp_path / "bar-1.txt").read_text() == ""
    assert (tmp_path / "metrics-0.csv").read_text().startswith("step,name,value\n")
    assert not (tmp_path / "metrics-1.csv").exists()
