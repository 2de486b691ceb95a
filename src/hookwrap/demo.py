"""``python -m hookwrap demo``: a small training loop, extended without editing it.

The loop fits ``y = 3x + 1`` by gradient descent in plain Python (no torch
needed). Logging, loss scaling, a NaN guard and checkpointing are added from
outside with callbacks, and each one prints what it did.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from . import USING_EXTENSION
from .hookable import hookable
from .mixin import Hookable


class Trainer(Hookable):
    """A training loop that knows nothing about the callbacks added to it."""

    def __init__(self, lr: float = 0.05) -> None:
        self.w, self.b, self.lr = 0.0, 0.0, lr

    @hookable("loss")
    def compute_loss(self, batch: list[tuple[float, float]], scale: float = 1.0) -> float:
        err = [(self.w * x + self.b - y) for x, y in batch]
        return scale * sum(e * e for e in err) / len(batch)

    @hookable
    def step(self, batch: list[tuple[float, float]]) -> float:
        n = len(batch)
        gw = sum(2 * (self.w * x + self.b - y) * x for x, y in batch) / n
        gb = sum(2 * (self.w * x + self.b - y) for x, y in batch) / n
        self.w -= self.lr * gw
        self.b -= self.lr * gb
        return self.compute_loss(batch)

    @hookable
    def epoch(self, index: int, batches: list[list[tuple[float, float]]]) -> float:
        return sum(self.step(batch) for batch in batches) / len(batches)


def run(out: Callable[[str], Any] = print) -> Trainer:
    data = [[(x / 10, 3 * x / 10 + 1) for x in range(i, i + 4)] for i in range(0, 16, 4)]
    trainer = Trainer(lr=0.4)

    # Logging: reads the epoch index and its result; consumes nothing, returns None.
    @trainer.after("epoch")
    def log_epoch(self, index, return_value):
        out(f"  post-epoch   epoch {index}: mean loss {return_value:.4f}  (w={self.w:.3f}, b={self.b:.3f})")
        return return_value

    # Loss scaling: takes `scale`, so it returns the (replaced) value.
    def scale_loss(self, scale):
        return scale * 0.5

    # NaN guard: takes the result, must return it.
    def nan_guard(self, return_value):
        if math.isnan(return_value):
            raise FloatingPointError("loss is NaN")
        return return_value

    # Checkpointing: every other epoch, keep the parameters.
    checkpoints: list[tuple[int, float, float]] = []

    def checkpoint(self, index):
        if index % 2 == 1:
            checkpoints.append((index, self.w, self.b))
            out(f"  post-epoch   checkpoint saved after epoch {index}")

    trainer.before("loss", scale_loss)
    trainer.after("loss", nan_guard)
    trainer.after("epoch", checkpoint)

    first = trainer.compute_loss(data[0])
    out(f"pre-loss  scale_loss halves the loss scale: loss of batch 0 = {first:.4f} "
        f"(unscaled {trainer.compute_loss.__wrapped__(trainer, data[0]):.4f})")
    for index in range(6):
        trainer.epoch(index, data)
    out(f"trained: w={trainer.w:.3f} (target 3), b={trainer.b:.3f} (target 1); "
        f"{len(checkpoints)} checkpoints; dispatch: "
        f"{'compiled' if USING_EXTENSION else 'pure Python'}")
    return trainer
