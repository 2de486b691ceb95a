"""``StepTimer``: the wall time of each step, without synchronizing CUDA per step."""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any

from ..errors import HookError
from ._attach import On, ShippedCallback

__all__ = ["StepTimer"]


class StepTimer(ShippedCallback):
    """Times each call of ``step_event`` (default ``"step"``).

    On the CPU with ``time.perf_counter``. With ``device="cuda"`` with a pair of
    ``torch.cuda.Event`` recorded on the current stream: the pairs are read back
    lazily, those already complete after each step (``Event.query``, which never
    blocks) and the rest when ``times`` is read, so timing adds no
    ``synchronize()`` to the loop. ``times`` are seconds, in step order.
    """

    def __init__(self, device: Any = "cpu", step_event: str = "step") -> None:
        self.timed_event = step_event
        self.cuda = str(device).startswith("cuda")
        if self.cuda:
            import torch

            if not torch.cuda.is_available():
                raise HookError("StepTimer(device='cuda'): CUDA is not available here; "
                                 "time on the CPU with device='cpu'.")
        self._times: list[float] = []
        self._pending: deque[tuple[Any, Any]] = deque()
        self._start: Any = None

    listens = (On("pre", "timed_event", "start", always=True), On("post", "timed_event", "stop", always=True))


    def start(self, obj: Any) -> None:
        if self.cuda:
            import torch

            self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call, unused-ignore]
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self, obj: Any) -> None:
        if not self.cuda:
            self._times.append(time.perf_counter() - self._start)
            return
        import torch

        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call, unused-ignore]
        end.record()
        self._pending.append((self._start, end))
        while self._pending and self._pending[0][1].query():  # completed ones only
            self._read(*self._pending.popleft())

    def _read(self, start: Any, end: Any) -> None:
        self._times.append(start.elapsed_time(end) / 1000.0)

    @property
    def times(self) -> list[float]:
        """Seconds per step, every step so far (waits for CUDA steps still running)."""
        while self._pending:
            start, end = self._pending.popleft()
            end.synchronize()
            self._read(start, end)
        return self._times

    @property
    def count(self) -> int:
        return len(self._times) + len(self._pending)

    def mean(self) -> float:
        return statistics.fmean(self.times) if self.count else 0.0

    def median(self) -> float:
        return statistics.median(self.times) if self.count else 0.0

    def summary(self) -> str:
        """One line: the steps timed, their median and mean (``hookwrap run`` prints it at the end)."""
        return f"StepTimer: {self.count} steps, median {self.median() * 1e3:.3f} ms, mean {self.mean() * 1e3:.3f} ms"
