"""``NanGuard``: stop the run when a loss or metric is NaN or infinite."""

from __future__ import annotations

import functools
import logging
import math
import sys
from collections.abc import Mapping
from typing import Any, Callable

from ..extend import Ending, JoinPointInfo, per_join_point, reader
from ._attach import CountingCallback, DefaultEvent, On, event_names, loss_reader, whole_number
from .distributed import is_distributed, per_rank, ranks_where
from .readback import DecidesAtReadBacks, shared

__all__ = ["NanGuard", "NonFiniteError"]

log = logging.getLogger(__name__)  # under "hookwrap": the decision to stop, at INFO


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
    if isinstance(value, (tuple, list)):  # (logits, loss): nanoGPT's forward
        for index, item in enumerate(value):
            found = _first_non_finite(item)
            if found is not None:
                return f"[{index}]{found[0]}", found[1]
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


# Deferred checks are read back (and decided on) at the end of each epoch.
_READS_AT_EPOCHS = (On("post", "epoch_event", "end_of_epoch"),)

class NanGuard(DecidesAtReadBacks, CountingCallback):
    """Raises ``NonFiniteError`` naming the event, the step and the value when
    the loss or metrics of one of ``events`` are NaN or infinite: the join point's
    ``argument`` (default ``loss``, as in ``backward(loss)``) where it has one, else
    what it returns (a loss tensor, a float, a mapping of metrics, or a tuple or
    list of them: a model's ``(logits, loss)``). A join point
    that has neither (it returns None) is refused when the guard is attached.

    ``events`` are join point names (default: ``"loss"``); the step counted is that of
    ``step_event`` (the join point ``step`` where the target has one).

    Without a host sync per step (the default): a tensor's check is queued on its
    device (its value, or for a larger tensor whether it is all finite and its first
    bad element) and read back with the other shipped callbacks' values
    (:mod:`hookwrap.torch.readback`) once ``check_every`` checks are queued, at the
    start of the next step (in the check itself where the target has no step
    event), at the end of each ``epoch_event``, and at every boundary of its
    lifecycle (``hookwrap.extend.Defers``), waiting for the device: the end of
    ``fit_event`` however it ends, or of the outermost ``fit`` of another object
    that drove this one, ``callback_state``, the end of a ``hookwrap run`` script or
    a notebook cell, SIGTERM, interpreter exit (reported on stderr, exit status 1).
    No loop shape costs a read per step: on a loop with no ``fit`` the last
    checks are decided at the next of those. The guard then raises naming the step
    where the value *first* went non-finite; the run stops at most
    ``check_every - 1`` steps after that step, or at the boundary. When another
    error is already leaving the run, a non-finite value found is a note on it. On
    CUDA the copy back is asynchronous (pinned memory and an event), so a
    read-back point may find the copy still running and decide at the next one.
    A Python number is checked at once.
    ``check_pending()`` decides now, for loops without epoch or fit join points.
    ``sync=True`` checks every value at once (one read per check; a device sync on
    CUDA) and stops at the step itself.

    Under torch.distributed every rank stops together: each read-back point (each
    check with ``sync=True``) shares whether, and at which step, the value was not
    finite with one all-reduce, and when it was not on any rank, every rank raises,
    naming the first such step and the rank(s) where it was not.
    """

    def __init__(self, events: tuple[str, ...] | list[str] | str = ("loss",),
                 step_event: str | None = DefaultEvent("step"), argument: str = "loss", *,
                 sync: bool = False, check_every: int = 20,
                 epoch_event: str | None = DefaultEvent("epoch"),
                 fit_event: str | None = DefaultEvent("fit")) -> None:
        super().__init__(step_event)
        self.events = event_names(events, "NanGuard")
        self.argument = argument
        self.sync = bool(sync)
        self.check_every = whole_number(check_every, "check_every", "NanGuard")
        self.epoch_event, self.fit_event = epoch_event, fit_event
        self.checked = 0
        self._first: tuple[int, str, Any, str, int, str] | None = None  # (check, what, value, where, step, of)
        self._last_what = ""
        self.run_event = fit_event if not self.sync else None

    @property
    def state_key(self) -> str:
        return f"NanGuard[{','.join(self.events)}]"

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        pairs: list[tuple[str, Callable[..., Any]]] = []
        for name in self.events:
            self.wants(target, name)
            choose = functools.partial(self._choose, name)
            pairs.append((f"post-{name}", per_join_point(self, f"check[{name}]", choose)))
        self._steps_counted = self.wants(target, self.step_event)
        if not self.sync:
            pairs += self.registrations(target, _READS_AT_EPOCHS)
            self.wants(target, self.fit_event)  # a boundary (Defers): checked here, a name must exist
        return pairs

    def boundary_advice(self, target: Any, pairs: list[tuple[str, Callable[..., Any]]]) \
            -> list[tuple[str, Callable[..., Any]]]:
        return [] if self.sync else super().boundary_advice(target, pairs)  # sync: nothing deferred

    def settle(self, obj: Any, ending: Ending) -> None:
        """A boundary (``hookwrap.extend.Defers``): decide on every check queued
        (those of ``obj``, or all at a process-wide boundary); when an error is
        leaving, note a non-finite value on it instead."""
        if ending.failed:
            assert ending.exception is not None
            self.failed_fit(obj, ending.exception)
        else:  # whatever is pending, of this object or another it checked (one guard, two models)
            self._read_back(wait=True)

    def pending(self) -> str:
        return f"{self._since} NaN checks not yet read" if self._since else ""

    def _choose(self, event: str, jp: JoinPointInfo) -> Any:
        """The value watched on one join point: its ``argument`` (``loss``: accelerate's
        ``backward(loss)``) where it has one, else what it returns."""
        if self.argument in jp.arguments:  # named so: the message says which was checked
            return reader(self.check_argument, "post-", self.argument, (event,))
        return loss_reader("NanGuard", jp, self.argument, self.check,
                           "Watch the join point that computes the loss, or pass argument= the name of the "
                           "argument that carries it.", (event,))

    def check(self, obj: Any, event: str, value: Any) -> None:
        """What ``event`` returned."""
        self._check(obj, f"event 'post-{event}' returned", value)

    def check_argument(self, obj: Any, event: str, value: Any) -> None:
        """The ``argument`` ``event`` was called with."""
        self._check(obj, f"argument {self.argument!r} of {event!r} was", value)

    def _count_step(self, obj: Any) -> None:
        self.read_if_due()  # check_every checks queued in the steps before this one
        self.step += 1

    def failed_fit(self, obj: Any, exception: BaseException) -> None:
        """``fit`` raised: nothing it queued is carried into the next fit. A value read
        back non-finite is noted on the error (on this rank; no collective here, as
        the other ranks may not be failing)."""
        try:
            shared().read(wait=True)
        except Exception:  # noqa: BLE001 - the device may be what failed: keep its error
            pass
        first, self._first = self._first, None
        self._since, self._due, self._checked_on = 0, False, None
        if first is not None:
            _, what, value, path, step, of = first
            when = f"at step {step}" if step else "before any step was counted"
            found = f"NanGuard: before this error, {what} {value}{path} {when}{of}."
            exception.add_note(found)
            if not isinstance(exception, Exception):  # KeyboardInterrupt, SystemExit: notes go unprinted
                print(f"hookwrap: {found} ({type(exception).__name__} ended the run.)", file=sys.stderr)

    def _check(self, obj: Any, what: str, value: Any) -> None:
        self.checked += 1
        if self.sync:
            self._check_now(obj, what, value)
            return
        self._last_what = what
        of = f" ({type(obj).__name__})" if obj is not None else ""
        found_now = self._queue(value, "", (self.checked, what, self.step, of))
        if (found_now or self._first is not None) and not is_distributed():
            # A number (decided now, after the tensors queued before it), or a value
            # delivered by another callback's read.
            self._since += 1
            self._checked_on = id(obj)
            self._read_back(wait=True)
            return
        self.queued(obj)  # read back once check_every are queued

    def _queue(self, value: Any, path: str, context: tuple[int, str, int, Any]) -> bool:
        """Queue the checks of ``value``'s tensors on their device; True when a plain
        number in it is not finite (recorded at once)."""
        if isinstance(value, Mapping):
            found = False
            for key, item in value.items():
                found = self._queue(item, f"{path}[{key!r}]", context) or found
            return found
        if isinstance(value, (tuple, list)):  # (logits, loss): each element checked
            found = False
            for index, item in enumerate(value):
                found = self._queue(item, f"{path}[{index}]", context) or found
            return found
        if hasattr(value, "isfinite"):
            if not value.is_floating_point():
                return False  # integers and booleans are always finite
            size = value.numel()
            if size == 1:  # a loss: its value, read back as it is
                check = value
            elif size == 0:
                return False
            else:  # whether all are finite, and the first element that is not
                import torch

                flat = value.detach().reshape(-1)
                bad = ~torch.isfinite(flat)
                first = flat.index_select(0, bad.to(torch.uint8).argmax().reshape(1))
                check = torch.cat([bad.any().reshape(1).to(flat.dtype), first])
                path += "" if value.dim() == 0 else " (an element)"
            shared().put(check, functools.partial(self._delivered, context, path))
            return False
        if isinstance(value, (int, float)) and not math.isfinite(value):
            self._record(context, value, path)
            return True
        return False

    def _delivered(self, context: tuple[int, str, int, Any], path: str, values: list[float]) -> None:
        if len(values) == 1:
            if not math.isfinite(values[0]):
                self._record(context, values[0], path)
        elif values[0]:
            self._record(context, values[1], path)

    def _record(self, context: tuple[int, str, int, str], value: Any, path: str) -> None:
        check, what, step, of = context
        if self._first is None or check < self._first[0]:
            self._first = (check, what, value, path, step, of)

    def _read_back(self, wait: bool) -> None:
        """A read-back point: read the queued checks and stop when one was not finite
        (under torch.distributed: on any rank, with one all-reduce)."""
        if self._since == 0:  # nothing checked since the last one (the same on every rank)
            return
        self._since, self._due, self._checked_on = 0, False, None
        distributed = is_distributed()
        shared().read(wait=wait or distributed)
        if not distributed:
            if self._first is not None:
                self._raise(self._first, "")
            return
        first = self._first
        steps = per_rank(first[4] + 1 if first is not None else 0)  # 0: finite on that rank
        seen = [step for step in steps if step]
        if not seen:
            return
        earliest = min(seen)
        ranks = [rank for rank, step in enumerate(steps) if step == earliest]
        on = f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        if first is not None and first[4] + 1 == earliest:
            self._raise(first, on)
        import torch.distributed as dist

        when = f"at step {earliest - 1}" if earliest > 1 else "before any step was counted"
        of = first[5] if first is not None else ""
        self._stop(f"{self._last_what} NaN or infinite {when}{on} (finite on this rank, "
                   f"{dist.get_rank()}){of}")

    def _raise(self, first: tuple[int, str, Any, str, int, str], on: str) -> None:
        _, what, value, path, step, of = first
        when = f"at step {step}" if step else "before any step was counted"
        self._stop(f"{what} {value}{path} {when}{on}{of}")

    def _stop(self, seen: str) -> None:
        self._first = None
        log.info("NanGuard: %s: stopping the run", seen)
        raise NonFiniteError(
            f"NanGuard: {seen}. Stopping the run; lower the learning rate, clip "
            f"gradients, or check the inputs of that step."
        )

    def _check_now(self, obj: Any, what: str, value: Any) -> None:
        """``sync=True``: read the value back now (a device sync on CUDA) and decide."""
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
        self._stop(f"{seen}{of}")
