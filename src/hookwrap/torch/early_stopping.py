"""``EarlyStopping``: end the run when a monitored metric stops improving."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import StopTraining
from ._attach import DefaultEvent, Reader, CountingCallback, Source, to_float
from ._best import Best

__all__ = ["EarlyStopping"]


class EarlyStopping(CountingCallback):
    """Raises :class:`hookwrap.StopTraining` when ``monitor`` has not improved by more
    than ``min_delta`` for ``patience`` calls of ``event`` in a row.

    ``monitor`` is read from join point ``event`` (default ``"evaluate"``): an argument
    of that name, its ``return_value``, or a key of the mapping it returns. The loop
    ends the run by catching the exception::

        try:
            for epoch in range(epochs):
                ...
                self.evaluate(val_loader)
        except hookwrap.StopTraining as stop:
            print(stop)
    """

    def __init__(self, monitor: str = "val_loss", mode: str = "min", patience: int = 3,
                 min_delta: float = 0.0, event: str = "evaluate",
                 step_event: str | None = DefaultEvent("step")) -> None:
        super().__init__(step_event)
        if not isinstance(patience, int) or patience < 1:
            raise ValueError(f"EarlyStopping: patience must be an int >= 1, got {patience!r}.")
        self.monitor, self.event, self.patience = monitor, event, patience
        self.best = Best(mode, min_delta, self.where)
        self.wait = 0  # calls since the last improvement
        self.best_step = 0
        self.source: Source | None = None

    @property
    def where(self) -> str:
        return f"EarlyStopping(monitor={self.monitor!r})"

    @property
    def state_key(self) -> str:
        return f"EarlyStopping[monitor={self.monitor},mode={self.best.mode}]"

    def attach(self, target: type | None) -> list[tuple[str, Callable[..., Any]]]:
        self.source = self.find(target, self.event, self.monitor)
        return [(self.source.event, Reader(self.observe, self.source.event, self.source.name))]

    def observe(self, obj: Any, value: Any) -> None:
        assert self.source is not None
        current = to_float(self.source.pick(value, self.where))
        if self.best.improves(current):
            self.best.value, self.wait, self.best_step = current, 0, self.step
            return
        self.wait += 1
        if self.wait >= self.patience:
            raise StopTraining(
                f"EarlyStopping: {self.monitor} has not improved by more than "
                f"{self.best.min_delta} for {self.wait} evaluations (best {self.best.value:.6g} "
                f"at step {self.best_step}, now {current:.6g})."
            )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **self.best.state_dict(), "wait": self.wait,
                "best_step": self.best_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.best.load_state_dict(state)
        self.wait, self.best_step = state["wait"], state["best_step"]
