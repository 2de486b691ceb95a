"""Spawning torch.distributed ranks for a test: each rank runs ``worker(rank, *args)``
and writes ``rank-<r>.json`` into the test's folder; a run that does not finish in
time fails the test instead of hanging it. ``rank_main`` is a worker's body."""

from __future__ import annotations

import datetime
import gc
import json
import os
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


def rank_main(rank: int, world_size: int, init_file: str, out_dir: str, no_extensions: str,
              timeout_s: float, train: Callable[[], Any], backend: str = "gloo") -> None:
    """One spawned rank: the dispatch chosen by ``no_extensions`` (before hookwrap is
    imported), a gloo group (or ``backend``'s: ``"nccl"``, one GPU a rank),
    ``train()``'s result written to ``rank-<rank>.json``."""
    os.environ["HOOKWRAP_NO_EXTENSIONS"] = no_extensions
    import torch.distributed as dist

    # A collective some rank never joins raises after timeout_s instead of hanging.
    if backend == "nccl":
        import torch

        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = train()
        with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
            json.dump(result, f)
        gc.collect()  # gloo's threads must not outlive the tensors (see _distributed_worker)
        dist.barrier()
    finally:
        dist.destroy_process_group()
