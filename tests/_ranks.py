"""Spawning torch.distributed ranks for a test: each rank runs ``worker(rank, *args)``
and writes ``rank-<r>.json`` into the test's folder; a run that does not finish in
time fails the test instead of hanging it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest


def run_ranks(worker: Callable[..., None], args: tuple[Any, ...], world: int, deadline_s: float,
              results_in: Path) -> list[Any]:
    """Spawn ``world`` ranks of ``worker`` and return each rank's JSON results."""
    import torch.multiprocessing

    context = torch.multiprocessing.start_processes(worker, args=args, nprocs=world, join=False,
                                                    start_method="spawn")
    deadline = time.monotonic() + deadline_s
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world} ranks did not finish within {deadline_s} s (a deadlock?)")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [json.loads((results_in / f"rank-{r}.json").read_text()) for r in range(world)]
