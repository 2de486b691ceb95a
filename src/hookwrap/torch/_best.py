"""The best value of a monitored metric so far, and the base of the callbacks that
monitor one (EarlyStopping, BestCheckpoint)."""

from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import SettingError
from ..extend import reader
from ._attach import COUNT, NUMBER_OR_NONE, CountingCallback, Source, saved, to_float
from .distributed import all_ranks_mean

__all__ = ["Best", "MonitoredCallback"]


class Best:
    """Tracks the best value; ``improves(v)`` is True when ``v`` beats it by more than
    ``min_delta`` (NaN never does)."""

    def __init__(self, mode: str, min_delta: float, where: str) -> None:
        if mode not in ("min", "max"):
            raise SettingError(f"{where}: mode must be 'min' or 'max', got {mode!r}.")
        if not min_delta >= 0:
            raise SettingError(f"{where}: min_delta must be >= 0, got {min_delta!r}.")
        self.mode = mode
        self.min_delta = min_delta
        self.where = where
        self.value: float | None = None

    def improves(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.value is None:
            return True
        if self.mode == "min":
            return value < self.value - self.min_delta
        return value > self.value + self.min_delta

    def beats(self, value: float) -> bool:
        """Is ``value`` better than the best at all (``min_delta`` aside)?"""
        if math.isnan(value) or self.value is None:
            return not math.isnan(value)
        return value < self.value if self.mode == "min" else value > self.value

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = saved(state, "best", NUMBER_OR_NONE, self.where)


class MonitoredCallback(CountingCallback):
    """Reads ``monitor`` from join point ``event`` after each call (an argument, the
    return value, or a key of the returned mapping) and tracks its best value;
    subclasses act in ``improved`` / ``not_improved``. Under torch.distributed the
    value is the mean over the ranks (``all_ranks_mean``: one all-reduce per call), so
    every rank takes the same decision at the same call."""

    def __init__(self, monitor: str, mode: str, min_delta: float, event: str,
                 step_event: str | None) -> None:
        super().__init__(step_event)
        self.monitor, self.event = monitor, event
        self.best = Best(mode, min_delta, self.where)
        self.best_step = 0
        self.source: Source | None = None

    def attach(self, target: type | None) -> list[tuple[str, Callable[..., Any]]]:
        self.source = self.find(target, self.event, self.monitor)
        return [(self.source.event, reader(self.observe, self.source.event, self.source.name))]

    def observe(self, obj: Any, value: Any) -> None:
        assert self.source is not None
        self.judge(obj, all_ranks_mean(to_float(self.source.pick(value, self.where))))

    def judge(self, obj: Any, current: float) -> None:
        """One monitored value, the same on every rank: an improvement or not."""
        if self.best.improves(current):
            self.best.value, self.best_step = current, self.step
            self.improved(obj, current)
        else:
            self.not_improved(obj, current)

    def improved(self, obj: Any, value: float) -> None:
        pass

    def not_improved(self, obj: Any, value: float) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **self.best.state_dict(), "best_step": self.best_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        best_step = saved(state, "best_step", COUNT, self.where)
        saved(state, "best", NUMBER_OR_NONE, self.where)  # checked before anything is set
        super().load_state_dict(state)
        self.best.load_state_dict(state)
        self.best_step = best_step
