"""Reading device values back to the host without waiting for the device each step.

A ``.item()`` (``float(t)``, ``.tolist()``) of a CUDA tensor waits until every
kernel queued before it has run: the CPU cannot run ahead of the GPU, and for a
small fast model that wait is a large share of the step. The shipped callbacks
instead *queue* the device values they need (a loss, a gradient norm, NanGuard's
check) with ``ReadBack.put``, and read everything queued together:

* on the CPU, with one ``.tolist()`` of the queued values concatenated;
* on CUDA, with one non-blocking copy into pinned host memory per read, followed
  by a ``torch.cuda.Event``; the values are delivered once ``event.query()`` says
  the copy is done (``read()``), or after waiting for it (``read(wait=True)``, at
  the end of a run).

One reader is shared by the callbacks of a process (``shared``), so a read
that one callback needs delivers every other callback's queued values too.

``count_host_reads`` counts the reads of tensor values a block makes, to
check that a loop and its callbacks read the device back as rarely as you think.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any, Callable

from ..extend import Defers, deferring_callbacks, track_deferring

__all__ = ["DecidesAtReadBacks", "HostReads", "QueuesReadBacks", "ReadBack", "count_host_reads", "defers_decisions",
           "settle", "shared"]

Deliver = Callable[[list[float]], None]


class ReadBack:
    """Device values waiting to be read back to the host, read together.

    ``put(tensor, deliver)`` queues ``tensor`` (any shape, any device; it is
    detached, and flattened when read) and calls ``deliver(values)`` with
    its elements as Python floats once they have been read. ``read()`` reads what
    is queued: one ``.tolist()`` for CPU tensors, one asynchronous copy per CUDA
    device, delivered when complete; ``read(wait=True)`` also waits for the copies
    in flight. ``deliver`` runs in queue order per device; it must not raise
    (record, and act after the read). A queue that reaches ``max_queued`` values
    (no callback reading back: a logger with no epoch join point) is read then,
    so it never grows without bound."""

    max_queued = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: list[tuple[Any, Deliver]] = []
        self._in_flight: deque[tuple[Any, Any, list[tuple[int, Deliver]]]] = deque()
        self.reads = 0  # host reads made (CPU .tolist() calls and CUDA copies started)

    def put(self, tensor: Any, deliver: Deliver) -> None:
        """Queue ``tensor`` to be read; ``deliver(values)`` gets its elements."""
        # A copy on the device (no sync): the caller's tensor may be changed in place
        # before the read (a loss written into a reused buffer, a CUDA graph's output).
        detached = tensor.detach().clone()  # flattened when read: the per-step work stays small
        with self._lock:
            self._queued.append((detached, deliver))
            full = len(self._queued) >= self.max_queued
        if full:
            self.read()

    @property
    def pending(self) -> int:
        """Values queued or in flight, not yet delivered."""
        return len(self._queued) + len(self._in_flight)

    def read(self, wait: bool = False) -> None:
        """Read what is queued. CPU values are delivered at once (one ``.tolist()``);
        CUDA values are copied asynchronously and delivered when the copy is done:
        now if it already is, else at a later ``read``, or now with ``wait=True``."""
        with self._lock:
            queued, self._queued = self._queued, []
        if queued:
            self._start(queued)
        self._deliver_done(wait)

    def _start(self, queued: list[tuple[Any, Deliver]]) -> None:
        import torch

        by_device: dict[Any, list[tuple[Any, Deliver]]] = {}
        for tensor, deliver in queued:
            by_device.setdefault(tensor.device, []).append((tensor, deliver))
        for device, items in by_device.items():
            tensors = [tensor for tensor, _ in items]
            try:
                values = torch.stack(tensors).reshape(-1)  # the usual case: losses, one shape
            except RuntimeError:  # shapes differ
                values = torch.cat([t.reshape(-1) for t in tensors])
            if not values.is_floating_point():
                values = values.to(torch.float64)
            sizes = [(int(tensor.numel()), deliver) for tensor, deliver in items]
            self.reads += 1
            if device.type == "cuda":
                host = torch.empty(values.numel(), dtype=values.dtype, pin_memory=True)
                host.copy_(values, non_blocking=True)
                event = torch.cuda.Event()  # type: ignore[no-untyped-call, unused-ignore]
                event.record(torch.cuda.current_stream(device))
                with self._lock:
                    self._in_flight.append((event, host, sizes))
            else:  # the CPU (or a device without events): one read, now
                _hand_out(values.tolist(), sizes)

    def _deliver_done(self, wait: bool) -> None:
        while True:
            with self._lock:
                if not self._in_flight:
                    return
                event, host, sizes = self._in_flight[0]
                if not wait and not event.query():
                    return
                self._in_flight.popleft()
            if wait:
                event.synchronize()
            _hand_out(host.tolist(), sizes)  # pinned host memory: no device wait


def _hand_out(values: list[float], sizes: list[tuple[int, Deliver]]) -> None:
    start = 0
    for size, deliver in sizes:
        deliver(values[start:start + size])
        start += size


_SHARED = ReadBack()


class QueuesReadBacks:
    """Mixed into a callback that queues values on the shared read-back: a copy or a
    pickle of it (``copy.deepcopy``, ``torch.save`` of a hooked model) reads back
    first (``read_back``), as what is queued is delivered to this object, never to
    the copy."""

    def waits_for_read_back(self) -> bool:
        """Are values of this callback queued or in flight? By default it may have
        some, and ``read_back`` always reads; a callback that knows says."""
        return True

    def read_back(self) -> None:
        """Read back, waiting for the device, when this callback waits for values
        (what the other callbacks queued is delivered with them)."""
        if self.waits_for_read_back():
            shared().read(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        self.read_back()
        return self.__dict__.copy()


class DecidesAtReadBacks(Defers, QueuesReadBacks):
    """The base of a callback that queues device values and decides on them later
    (NanGuard, SpikeDetection; yours), at the points it declares rather than per
    value: once ``check_every`` values are queued (at the start of the next step
    where a step is counted, else at once), at the end of each epoch, and at every
    ending of ``hookwrap.extend.Defers`` (the run's end, a signal, exit, ...).
    ``readback.settle(obj)`` (a checkpoint about to be written) asks it to decide on
    ``obj``'s values first.

    A subclass queues with ``shared().put`` and then calls ``queued(obj)``, and
    implements ``_read_back(wait)``: read what is queued (``shared().read``) and
    decide, raising to stop the run. ``undecided()`` says how many values wait.
    ``settle`` decides at every ending but one an error leaves by (override it to
    note what it found on that error)."""

    check_every = 20
    _since = 0  # values queued since the last read-back point
    _due = False  # check_every values queued: read back at the next step's start
    _steps_counted = False  # a step join point is counted: the point is the next step's start
    _checked_on: int | None = None  # id() of the hooked object of the values queued (no reference)

    def _read_back(self, wait: bool) -> None:
        raise NotImplementedError(f"{type(self).__qualname__} must define _read_back(wait)")

    def queued(self, obj: Any) -> None:
        """One value of ``obj`` queued: read back once ``check_every`` wait."""
        self._since += 1
        self._checked_on = id(obj)
        if self._since >= self.check_every:
            if self._steps_counted:
                self._due = True
            else:
                self._read_back(wait=False)

    def read_if_due(self) -> None:
        """The start of a step: read back when ``check_every`` values were queued before it."""
        if self._due:
            self._read_back(wait=False)

    def end_of_epoch(self, obj: Any) -> None:
        self._read_back(wait=False)

    def undecided(self) -> int:
        """Values queued and not yet decided on."""
        return self._since

    def settle(self, obj: Any, ending: Any) -> None:
        if not ending.failed:
            self._read_back(wait=True)

    def pending(self) -> str:
        count = self.undecided()
        return f"{count} values not yet decided" if count else ""

    def decide_for(self, obj: Any) -> None:
        """``settle(obj)``: decide now on the values queued for ``obj`` (those of another
        loop, or of one abandoned mid-run, are not this one's to decide)."""
        if self.undecided() and self._checked_on == id(obj):
            self._read_back(wait=True)

    def check_pending(self) -> None:
        """Read back what is queued (waiting for the device) and decide now. Under
        torch.distributed a collective: call it on every rank at the same point."""
        self._read_back(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_checked_on": None}  # the hooked object is not copied with it


def defers_decisions(callback: Any) -> None:
    """Have ``settle`` ask ``callback`` (with ``decide_for(obj)``) to decide first. A
    ``DecidesAtReadBacks`` is asked once attached; this registers any other
    ``hookwrap.extend.Defers`` with a ``decide_for`` (the same registry)."""
    track_deferring(callback)


def settle(obj: Any) -> None:
    """Before an act on hooked object ``obj`` that cannot be undone (a checkpoint
    written): read back what is queued and let every callback that deferred a
    decision on ``obj`` take it now, so a run that went non-finite stops before its
    weights are saved. Under torch.distributed a collective: call it on every rank
    at the same point."""
    shared().read(wait=True)
    for callback in deferring_callbacks():
        decide = getattr(callback, "decide_for", None)
        if decide is not None:
            decide(obj)


def shared() -> ReadBack:
    """The reader the shipped callbacks of this process share."""
    return _SHARED


# Tensor methods that hand a tensor's values to Python: each is a host read (and on
# CUDA a wait for the device).
_READ_METHODS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")


class HostReads:
    """The host reads counted by ``count_host_reads``: ``count`` in all and
    ``by_method`` (``{"item": 3, "tolist": 1}``)."""

    def __init__(self) -> None:
        self.by_method: dict[str, int] = {}

    @property
    def count(self) -> int:
        return sum(self.by_method.values())

    def __repr__(self) -> str:
        return f"HostReads(count={self.count}, by_method={self.by_method})"


@contextlib.contextmanager
def count_host_reads() -> Iterator[HostReads]:
    """Counts, in the block, the calls that read a tensor's values back to the host:
    ``.item()``, ``.tolist()``, ``float()``, ``int()``, ``bool()``, ``.cpu()`` and
    ``.numpy()`` of any ``torch.Tensor`` (on CPU tensors too, so that a CPU run
    counts what a CUDA run would wait for), from any thread. It patches
    ``torch.Tensor`` for the block: for tests and measurements, not production:

        with count_host_reads() as reads:
            trainer.fit(1)
        print(reads.count / trainer.steps, "host reads per step")
    """
    import torch

    counted = HostReads()
    lock = threading.Lock()
    saved: dict[str, Any] = {}
    for name in _READ_METHODS:
        if name in torch.Tensor.__dict__:
            saved[name] = torch.Tensor.__dict__[name]
        original = getattr(torch.Tensor, name)

        def counting(self: Any, *args: Any, _name: str = name, _original: Any = original,
                     **kwargs: Any) -> Any:
            with lock:
                counted.by_method[_name] = counted.by_method.get(_name, 0) + 1
            return _original(self, *args, **kwargs)

        setattr(torch.Tensor, name, counting)
    try:
        yield counted
    finally:
        for name in _READ_METHODS:
            if name in saved:
                setattr(torch.Tensor, name, saved[name])
            else:
                delattr(torch.Tensor, name)
