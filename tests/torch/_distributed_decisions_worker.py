"""One process of tests/torch/test_distributed_decisions.py (spawned: importable by name).

A DDP-wrapped model in a hookable loop on the gloo backend, where the ranks
disagree: each evaluates its own values, or one sees a NaN loss. The shipped
callbacks must decide together, or a rank that stops alone leaves the other
waiting in DDP's next gradient all-reduce (here: until the process group's
timeout, which fails the test instead of hanging it).

Scenarios (``scenario``):

* ``early_stopping``: EarlyStopping(patience=2) on per-rank val_loss that would stop
  rank 0 alone at evaluation 3, rank 1 alone at 5; their mean stops at 6.
* ``nan``: rank 1's loss is NaN at step 7; NanGuard(sync=True) stops both at step 7.
* ``nan_deferred``: the same with NanGuard(check_every=4), which reads its checks
  back at the start of steps 5 and 9: both stop there, after step 8, naming step 7.
* ``spike``: rank 1's loss spikes (x 1000, its gradient unchanged) at step 7;
  SpikeDetection(check_every=4) decides at the start of step 9 on both ranks: rank
  1 raises TrainingSpikeError naming step 7, rank 0 one naming rank 1.
* ``spike_stop``: the same with action="stop", check_every=1: both stop with
  StopTraining at the start of step 8.
* ``time_limit``: TimeLimit(55) on a clock injected per rank, 1 s a step on rank
  0 and 10 s a step on rank 1: rank 1's budget is spent after step 6, and both
  stop there (rank 0 alone would go on to step 55).
* ``best_checkpoint``: BestCheckpoint(restore_best=True) on per-rank val_loss whose
  best is evaluation 2 for rank 0 alone, 3 for the mean: rank 0 writes one file,
  every rank restores the weights of evaluation 3.
"""

from __future__ import annotations

import math
import os
from typing import Any

from tests._ranks import rank_main

STEPS_PER_EVAL = 2
VAL_LOSSES = {  # per scenario, per rank: one value per evaluation
    "early_stopping": [[1.0, 1.0, 1.0, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9],
                       [4.0, 4.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]],
    "nan": [[1.0] * 10, [1.0] * 10],
    "nan_deferred": [[1.0] * 10, [1.0] * 10],
    "best_checkpoint": [[1.0, 0.5, 0.9, 0.9, 0.9], [1.0, 2.0, 0.5, 0.9, 0.9]],
    "spike": [[1.0] * 10, [1.0] * 10],
    "spike_stop": [[1.0] * 10, [1.0] * 10],
    "time_limit": [[1.0] * 40, [1.0] * 40],
}
NAN_STEP, NAN_RANK = 7, 1
SPIKE_STEP, SPIKE_RANK = 7, 1
TIME_LIMIT_S, SECONDS_PER_STEP = 55.0, (1.0, 10.0)  # per rank


def run(rank: int, world_size: int, init_file: str, out_dir: str, no_extensions: str,
        scenario: str, timeout_s: float) -> None:
    rank_main(rank, world_size, init_file, out_dir, no_extensions, timeout_s,
              lambda: _train(rank, out_dir, scenario))


def _train(rank: int, out_dir: str, scenario: str) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import hookwrap as hw
    from hookwrap.torch import (BestCheckpoint, EarlyStopping, NanGuard, NonFiniteError, SpikeDetection,
                                TimeLimit, TrainingSpikeError)

    torch.manual_seed(rank)  # different data per rank; DDP keeps the weights equal
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    val_losses = iter(VAL_LOSSES[scenario][rank])
    log: dict[str, Any] = {"evaluations": 0, "steps": 0, "weights": [], "stopped": None}

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model, self.optimizer = model, optimizer

        @hw.hookable
        def fit(self) -> None:
            for _ in range(len(VAL_LOSSES[scenario][rank])):
                for _ in range(STEPS_PER_EVAL):
                    self.step(torch.randn(8, 4))
                self.evaluate()

        @hw.hookable
        def step(self, batch: Any) -> Any:
            log["steps"] += 1
            optimizer.zero_grad()
            loss = self.loss(batch)
            loss.backward()  # DDP all-reduces the gradients: every rank must get here
            optimizer.step()
            return loss

        @hw.hookable
        def loss(self, batch: Any) -> Any:
            loss = model(batch).pow(2).mean()
            if scenario.startswith("nan") and rank == NAN_RANK and log["steps"] == NAN_STEP:
                loss = loss * math.nan
            if scenario.startswith("spike") and rank == SPIKE_RANK and log["steps"] == SPIKE_STEP:
                loss = loss + loss.detach() * 999  # the value spikes, the gradient does not
            return loss

        @hw.hookable
        def evaluate(self) -> dict[str, float]:
            log["evaluations"] += 1
            log["weights"].append(model.module.weight.detach().flatten().tolist())
            return {"val_loss": next(val_losses)}

    loop = Loop()
    path = os.path.join(out_dir, "best.pt")
    if scenario == "early_stopping":
        loop.add_callback(EarlyStopping("val_loss", patience=2))
    elif scenario == "nan":
        loop.add_callback(NanGuard(sync=True))
    elif scenario == "nan_deferred":
        loop.add_callback(NanGuard(check_every=4))
    elif scenario.startswith("spike"):
        stop = scenario == "spike_stop"
        loop.add_callback(SpikeDetection(rtol=50.0, action="stop" if stop else "raise",
                                         check_every=1 if stop else 4))
    elif scenario == "time_limit":
        loop.add_callback(TimeLimit(TIME_LIMIT_S, clock=lambda: log["steps"] * SECONDS_PER_STEP[rank]))
    else:
        checkpoint = BestCheckpoint(path, "val_loss", restore_best=True)
        loop.add_callback(checkpoint)
    try:
        loop.fit()
    except (hw.StopTraining, NonFiniteError, TrainingSpikeError) as stop:
        log["stopped"] = f"{type(stop).__name__}: {stop}"
        if isinstance(stop, TrainingSpikeError):
            log["spike_step"], log["bad_steps"] = stop.step, stop.bad_steps
    log["restored"] = model.module.weight.detach().flatten().tolist()
    if scenario == "best_checkpoint":
        log["saved"] = checkpoint.saved
        log["best"] = checkpoint.best.value
        log["file"] = torch.load(path, weights_only=True)["model"]["module.weight"].flatten().tolist()
    return log
