"""``NanGuard``: stop the run when a loss or metric is NaN or infinite."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable

from ._attach import DefaultEvent, reader, CountingCallback

__all__ = ["NanGuard", "NonFiniteError"]


class NonFiniteError(FloatingPointError):
    """A watched loss or metric was NaN or infinite."""


def _first_non_finite(value: Any) -> tuple[str, Any] | None:
    """``(where in the value, the bad value)`` or None when everything is finite."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _first_non_finite(item)
            if found is not None:
                return f"[{key!r}]{found[0]}", found[1]
        return None
    if hasattr(value, "isfinite"):  # a tensor: one read-back (a sync on CUDA)
        import torch

        if value.numel() == 1:  # a loss: reading the number is cheaper than a reduction
            number = value.item()
            return None if math.isfinite(number) else ("", number)
        if not value.is_floating_point() or bool(torch.isfinite(value).all()):
            return None
        bad = value.detach()[~torch.isfinite(value.detach())].flatten()[0].item()
        return ("" if value.dim() == 0 else " (an element)"), bad
    if isinstance(value, (int, float)) and not math.isfinite(value):
        return "", value
    return None


class NanGuard(CountingCallback):
    """Raises :class:`NonFiniteError` naming the event, the step and the value when
    what one of ``events`` returns (a loss tensor, a float, or a mapping of metrics)
    is NaN or infinite.

    ``events`` are join point names (default: ``"loss"``); the step counted is that of
    ``step_event`` (the join point ``step`` where the target has one). On CUDA each
    check reads one boolean back from the device: pass ``every=N`` to
    ``add_callback`` to check every N-th call only.
    """

    def __init__(self, events: tuple[str, ...] | list[str] | str = ("loss",),
                 step_event: str | None = DefaultEvent("step")) -> None:
        super().__init__(step_event)
        self.events = (events,) if isinstance(events, str) else tuple(events)
        self.checked = 0

    @property
    def state_key(self) -> str:
        return f"NanGuard[{','.join(self.events)}]"

    def attach(self, target: type | None) -> list[tuple[str, Callable[..., Any]]]:
        pairs: list[tuple[str, Callable[..., Any]]] = []
        for name in self.events:
            self.wants(target, name)
            pairs.append((f"post-{name}", reader(self.check, "post-", "return_value", (name,))))
        return pairs

    def check(self, obj: Any, event: str, value: Any) -> None:
        self.checked += 1
        found = _first_non_finite(value)
        if found is not None:
            when = f"at step {self.step}" if self.step else "before any step was counted"
            raise NonFiniteError(
                f"NanGuard: event 'post-{event}' returned {found[1]}{found[0]} {when} "
                f"({type(obj).__name__}). Stopping the run; lower the learning rate, "
                f"clip gradients, or check the inputs of that step."
            )
