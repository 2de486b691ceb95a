"""The best value of a monitored metric so far (EarlyStopping, BestCheckpoint)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import HookError

__all__ = ["Best"]


class Best:
    """Tracks the best value; ``improves(v)`` is True when ``v`` beats it by more than
    ``min_delta`` (NaN never does)."""

    def __init__(self, mode: str, min_delta: float, where: str) -> None:
        if mode not in ("min", "max"):
            raise HookError(f"{where}: mode must be 'min' or 'max', got {mode!r}.")
        if not min_delta >= 0:
            raise HookError(f"{where}: min_delta must be >= 0, got {min_delta!r}.")
        self.mode = mode
        self.min_delta = min_delta
        self.value: float | None = None

    def improves(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.value is None:
            return True
        if self.mode == "min":
            return value < self.value - self.min_delta
        return value > self.value + self.min_delta

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["best"]
