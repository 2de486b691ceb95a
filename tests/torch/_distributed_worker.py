"""One process of tests/torch/test_distributed.py (spawned: importable by name).

A DDP-wrapped model in a hookable loop, on the gloo backend: one callback on every
rank, one registered with ``rank_zero_only=True``, a slow rank-0-only one (the
others wait for it in the next all-reduce, and do not deadlock), and the shipped
ProgressBar and MetricsLogger, which print and write on rank 0 only.
"""

from __future__ import annotations

import gc
import json
import os
import time
from typing import Any


def run(rank: int, world_size: int, init_file: str, out_dir: str, no_extensions: str) -> None:
    os.environ["HOOKWRAP_NO_EXTENSIONS"] = no_extensions
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        _train(rank, out_dir)
        # Gloo's worker threads must not outlive the interpreter holding tensors (a
        # SIGABRT at exit, "terminate called without an active exception"): the DDP
        # model died with _train; every rank reaches teardown before any tears down.
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _train(rank: int, out_dir: str) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import hookwrap as hw
    from hookwrap.torch import MetricsLogger, ProgressBar

    torch.manual_seed(rank)  # different data per rank; DDP keeps the weights equal
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class Loop(hw.Hookable):
        @hw.hookable
        def epoch(self, steps: int) -> None:
            for _ in range(steps):
                self.step(torch.randn(8, 4))

        @hw.hookable
        def step(self, batch: Any) -> Any:
            optimizer.zero_grad()
            loss = self.loss(batch)
            loss.backward()  # DDP all-reduces the gradients: every rank must get here
            optimizer.step()
            return loss

        @hw.hookable
        def loss(self, batch: Any) -> Any:
            return model(batch).pow(2).mean()

    counts = {"every rank": 0, "rank zero only": 0}

    def on_every_rank(self: Loop) -> None:
        counts["every rank"] += 1

    def on_rank_zero(self: Loop) -> None:
        counts["rank zero only"] += 1
        time.sleep(0.05)  # slow, on rank 0 alone

    loop = Loop()
    loop.after("step", on_every_rank)
    loop.after("step", on_rank_zero, rank_zero_only=True)
    with open(os.path.join(out_dir, f"bar-{rank}.txt"), "w") as bar_file:
        loop.add_callback(ProgressBar(total=5, file=bar_file, metrics_event=None))
        loop.add_callback(MetricsLogger(os.path.join(out_dir, f"metrics-{rank}.csv"),
                                        tensorboard=False))
        for _ in range(2):
            loop.epoch(5)
    weight = float(model.module.weight.detach().sum())
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"counts": counts, "weight": weight,
                   "compiled": hw.USING_EXTENSION}, f)
