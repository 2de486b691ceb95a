"""Module-level targets for pickling tests (pickle finds them by reference).

``build(hw)`` (re)creates them with the hookwrap implementation under test.
"""

from __future__ import annotations

from typing import Any

train_step: Any = None
Trainer: Any = None


def double_batch(self: Any, batch: Any) -> Any:
    return batch * 2


def build(hw: Any) -> None:
    global train_step, Trainer

    @hw.hookable
    def train_step(model, batch):  # type: ignore[no-redef]
        return (model, batch)

    class Trainer(hw.Hookable):  # type: ignore[no-redef]
        def __init__(self, lr=0.1):
            self.lr = lr

        @hw.hookable("loss")
        def compute_loss(self, batch):
            return batch + self.lr

    globals()["train_step"], globals()["Trainer"] = train_step, Trainer
    train_step.__module__ = Trainer.__module__ = __name__
    train_step.__qualname__ = "train_step"
    Trainer.__qualname__ = "Trainer"
