"""``NanGuard``: stop the run when a loss or metric is NaN or infinite."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Callable

from ..errors import CallbackSignatureError
from ._attach import CountingCallback, DefaultEvent, per_join_point, reader
from .distributed import is_distributed, ranks_where

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
    the loss or metrics of one of ``events`` are NaN or infinite: the join point's
    ``argument`` (default ``loss``, as in ``backward(loss)``) where it has one, else
    what it returns (a loss tensor, a float, or a mapping of metrics). A join point
    that has neither (it returns None) is refused when the guard is attached.

    ``events`` are join point names (default: ``"loss"``); the step counted is that of
    ``step_event`` (the join point ``step`` where the target has one). On CUDA each
    check reads one boolean back from the device: pass ``every=N`` to
    ``add_callback`` to check every N-th call only.

    Under torch.distributed every rank stops together: each check shares whether
    the value was finite with one all-reduce (``ranks_where``), and when it was not
    on any rank, every rank raises at that step, naming the rank(s) where it was not.
    """

    def __init__(self, events: tuple[str, ...] | list[str] | str = ("loss",),
                 step_event: str | None = DefaultEvent("step"), argument: str = "loss") -> None:
        super().__init__(step_event)
        self.events = (events,) if isinstance(events, str) else tuple(events)
        self.argument = argument
        self.checked = 0

    @property
    def state_key(self) -> str:
        return f"NanGuard[{','.join(self.events)}]"

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        pairs: list[tuple[str, Callable[..., Any]]] = []
        for name in self.events:
            self.wants(target, name)
            choose = functools.partial(self._choose, name)
            pairs.append((f"post-{name}", per_join_point(self, f"check[{name}]", choose)))
        return pairs

    def _choose(self, event: str, spec: Any) -> Any:
        """The value watched on one join point: its ``argument`` (``loss``: accelerate's
        ``backward(loss)``) where it has one, else what it returns."""
        if self.argument in spec.refs:
            return reader(self.check_argument, "post-", self.argument, (event,))
        if spec.returns_none:
            raise CallbackSignatureError(
                f"NanGuard: {spec.where} returns None and has no argument {self.argument!r}, so "
                f"there is nothing to check. Watch the join point that computes the loss, or "
                f"pass argument= the name of the argument that carries it."
            )
        return reader(self.check, "post-", "return_value", (event,))

    def check(self, obj: Any, event: str, value: Any) -> None:
        """What ``event`` returned."""
        self._check(obj, f"event 'post-{event}' returned", value)

    def check_argument(self, obj: Any, event: str, value: Any) -> None:
        """The ``argument`` ``event`` was called with."""
        self._check(obj, f"argument {self.argument!r} of {event!r} was", value)

    def _check(self, obj: Any, what: str, value: Any) -> None:
        self.checked += 1
        found = _first_non_finite(value)
        ranks = ranks_where(found is not None) if is_distributed() else None
        if found is None and not ranks:
            return
        when = f"at step {self.step}" if self.step else "before any step was counted"
        of = f" ({type(obj).__name__})" if obj is not None else ""
        if ranks is None:
            on = ""
        else:
            on = f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        if found is not None:
            seen = f"{what} {found[1]}{found[0]} {when}{on}"
        else:  # finite here, not on another rank: stop with it
            import torch.distributed as dist

            seen = f"{what} NaN or infinite {when}{on} (finite on this rank, {dist.get_rank()})"
        raise NonFiniteError(
            f"NanGuard: {seen}{of}. Stopping the run; lower the learning rate, clip "
            f"gradients, or check the inputs of that step."
        )
