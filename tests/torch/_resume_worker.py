"""A training run that resumes exactly: the loop of tests/torch/test_resume.py, and
one process of its 2-rank gloo test (spawned: importable by name).

The loop shuffles its data with torch's global RNG every epoch (``randperm``),
uses dropout, scales each loss by a draw from Python's ``random`` and NumPy's
global generator, decays its learning rate with a scheduler, and is stopped by
EarlyStopping. A run killed mid-epoch and resumed from ``last.pt`` must reach the
same weights and stop at the same evaluation as one that never stopped: it does
only if the model, optimizer, scheduler, counters, every RNG and EarlyStopping's
state all come back.
"""

from __future__ import annotations

import os
import random
from typing import Any

from tests._ranks import rank_main

EPOCHS = 40
BATCH = 8
SAMPLES = 48  # per rank: 6 steps per epoch


class Killed(RuntimeError):
    """The process "dies" here: the exception leaves the loop mid-epoch."""


def build(hw: Any, ht: Any, ckpt_dir: str, rank: int = 0, ddp: bool = False,
          kill_at: int | None = None, **checkpoint: Any) -> Any:
    """A fresh run: model, optimizer, scheduler, data, EarlyStopping and a
    Checkpoint(ckpt_dir) attached. Seeded the same every time it is built, so a
    resumed run starts from what a restart of the script would have."""
    import numpy
    import torch
    from torch import nn

    torch.manual_seed(1000 + rank)
    random.seed(rank)
    numpy.random.seed(rank)
    gen = torch.Generator().manual_seed(7 + rank)
    teacher = torch.randn(4, 1, generator=gen)
    inputs = torch.randn(SAMPLES, 4, generator=gen)
    targets = inputs @ teacher + 0.5 * torch.randn(SAMPLES, 1, generator=gen)
    val_inputs = torch.randn(32, 4, generator=gen)
    val_targets = val_inputs @ teacher + 0.5 * torch.randn(32, 1, generator=gen)
    model: Any = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
            self.steps = 0
            self.evaluations: list[float] = []
            self.stopped: str | None = None
            self.stop_epoch: int | None = None

        @hw.hookable
        def fit(self, epochs: int, start_epoch: int = 0) -> None:
            index = start_epoch
            try:
                for index in range(start_epoch, epochs):
                    self.epoch(index)
                    self.evaluate()
            except hw.StopTraining as stop:
                self.stopped, self.stop_epoch = str(stop), index

        @hw.hookable
        def epoch(self, index: int) -> None:
            self.model.train()
            order = torch.randperm(SAMPLES)  # the shuffle: torch's global RNG
            for start in range(0, SAMPLES, BATCH):
                rows = order[start:start + BATCH]
                self.step(inputs[rows], targets[rows])
            self.scheduler.step()

        @hw.hookable
        def step(self, x: Any, y: Any) -> Any:
            if self.steps == kill_at:
                raise Killed(f"killed before step {kill_at + 1}")
            self.steps += 1
            self.optimizer.zero_grad()
            # Python's and NumPy's RNG: a jitter of the loss scale.
            scale = 1.0 + 0.2 * random.random() + 0.2 * float(numpy.random.rand())
            loss = nn.functional.mse_loss(self.model(x), y) * scale
            loss.backward()
            self.optimizer.step()
            return loss.detach()

        @hw.hookable
        def evaluate(self) -> dict[str, float]:
            self.model.eval()
            with torch.no_grad():
                val_loss = float(nn.functional.mse_loss(self.model(val_inputs), val_targets))
            self.evaluations.append(val_loss)
            return {"val_loss": val_loss}

    loop = Loop()
    loop.add_callback(ht.EarlyStopping("val_loss", patience=2, min_delta=1e-3))
    loop.checkpoint = ht.Checkpoint(ckpt_dir, **checkpoint)
    loop.add_callback(loop.checkpoint)
    return loop


def resume(loop: Any) -> int:
    """Restore ``loop`` from its checkpoint's last.pt; the epoch to continue at."""
    state = loop.checkpoint.resume(loop, "last")
    loop.steps = state["step"]
    return int(state["epoch"])


def weights(loop: Any) -> list[list[float]]:
    return [p.detach().flatten().tolist() for p in loop.model.parameters()]


def straight_and_resumed(hw: Any, ht: Any, out_dir: str, kill_at: int, rank: int = 0,
                         ddp: bool = False) -> dict[str, Any]:
    """One run that never stops, one killed before step ``kill_at + 1`` and resumed
    in a fresh loop: what each reached."""
    straight = build(hw, ht, os.path.join(out_dir, "straight"), rank, ddp)
    straight.fit(EPOCHS)
    killed = build(hw, ht, os.path.join(out_dir, "killed"), rank, ddp, kill_at=kill_at)
    try:
        killed.fit(EPOCHS)
        raise AssertionError("the run was not killed")
    except Killed:
        pass
    resumed = build(hw, ht, os.path.join(out_dir, "killed"), rank, ddp)
    start = resume(resumed)
    resumed.fit(EPOCHS, start_epoch=start)
    return {
        name: {"weights": weights(loop), "steps": loop.steps, "stopped": loop.stopped,
               "stop_epoch": loop.stop_epoch, "evaluations": loop.evaluations}
        for name, loop in (("straight", straight), ("killed", killed), ("resumed", resumed))
    } | {"start_epoch": start}


def run(rank: int, world_size: int, init_file: str, out_dir: str, no_extensions: str,
        kill_at: int, timeout_s: float) -> None:
    def train() -> dict[str, Any]:
        import hookwrap as hw
        import hookwrap.torch as ht

        return straight_and_resumed(hw, ht, out_dir, kill_at, rank, ddp=True)

    rank_main(rank, world_size, init_file, out_dir, no_extensions, timeout_s, train)
