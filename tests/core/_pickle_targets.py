"""Module-level targets for pickling tests (pickle finds them by reference).

``build(hw)`` (re)creates them with the hookwrap implementation under test.
"""

from __future__ import annotations

from typing import Any

train_step: Any = None
Trainer: Any = None
Seen: Any = None  # a callback object reading the loss through a reader


def double_batch(self: Any, batch: Any) -> Any:
    return batch * 2


def build(hw: Any) -> None:
    global train_step, Trainer, Seen
    import importlib

    reader = importlib.import_module(hw.__name__ + ".extend").reader

    @hw.hookable
    def train_step(model, batch):  # type: ignore[no-redef]
        return (model, batch)

    class Trainer(hw.Hookable):  # type: ignore[no-redef]
        def __init__(self, lr=0.1):
            self.lr = lr

        @hw.hookable("loss")
        def compute_loss(self, batch):
            return batch + self.lr

    class Seen(hw.Callback):  # type: ignore[no-redef]
        def __init__(self) -> None:
            self.values: list[Any] = []

        def event_methods(self, target: Any) -> list[tuple[str, Any]]:
            return [("post-loss", reader(self.record, "post-", "return_value"))]

        def record(self, obj: Any, value: Any) -> None:
            self.values.append(value)

        def state_dict(self) -> dict[str, Any]:
            return {"values": list(self.values)}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.values = list(state["values"])

    globals()["train_step"], globals()["Trainer"], globals()["Seen"] = train_step, Trainer, Seen
    train_step.__module__ = Trainer.__module__ = Seen.__module__ = __name__
    train_step.__qualname__ = "train_step"
    Trainer.__qualname__ = "Trainer"
    Seen.__qualname__ = "Seen"
