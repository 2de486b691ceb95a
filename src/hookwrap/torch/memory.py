"""``MemoryMonitor``: the process's resident memory, and CUDA memory, every N steps."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..errors import HookError, SettingError
from ._attach import CountingCallback, On, whole_number
from .logs_into import LogsInto, checked_logger

__all__ = ["MemoryMonitor", "process_rss"]

_MIB = 1024.0 * 1024.0
_PROCESS: tuple[int, Any] | None = None  # (pid, psutil.Process) of this process


class MemoryMonitor(LogsInto, CountingCallback):
    """After every ``every``-th call of ``step_event`` (default ``"step"``), in MiB:

    * ``rss_mib``: the process's resident set size now (``psutil`` where it is
      installed, else ``/proc/self/statm``), and ``peak_rss_mib``, the most it has
      been since the process started (``resource.getrusage``, where there is one);
    * on CUDA (``device``, default the current CUDA device where there is one):
      ``cuda_allocated_mib`` and ``cuda_reserved_mib`` (``torch.cuda.memory_allocated``
      / ``memory_reserved``: tensors, and what the caching allocator holds) and
      their peaks ``cuda_peak_allocated_mib`` / ``cuda_peak_reserved_mib``: since
      the start, or since the last report with ``reset_peak=True``
      (``torch.cuda.reset_peak_memory_stats``, which resets them for everyone).

    Reading these reads counters the caching allocator keeps on the host (a copy
    taken under its lock): no device sync, no host read of a tensor. Each report
    goes to ``logger`` (a MetricsLogger, or any ``log_metrics`` logger) and ``history``
    (``(step, {name: value})``)."""

    def __init__(self, every: int = 10, device: Any = None, reset_peak: bool = False, logger: Any = None,
                 step_event: str = "step") -> None:
        import torch

        super().__init__(step_event)
        where = "MemoryMonitor"
        self.every = whole_number(every, "every", where)
        if not isinstance(reset_peak, bool):
            raise SettingError(f"{where}: reset_peak must be True or False, got {reset_peak!r}.")
        logger = checked_logger(logger, where)
        if device is None:
            resolved = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        else:
            try:
                resolved = torch.device(device)
            except (RuntimeError, TypeError):
                raise SettingError(f"{where}: device must be a torch.device or a name like 'cuda' or 'cpu', "
                                   f"got {device!r}.") from None
        if resolved.type == "cuda" and not torch.cuda.is_available():
            raise HookError(f"{where}(device={device!r}): CUDA is not available here; pass device='cpu' "
                            f"(the process's memory alone).")
        if process_rss() is None:
            raise HookError(f"{where}: cannot read this process's resident memory here (no psutil, no "
                            f"/proc/self/statm): pip install psutil.")
        self.device = resolved
        self.cuda = resolved.type == "cuda"
        self.reset_peak, self.logger = reset_peak, logger
        self.history: list[tuple[int, dict[str, float]]] = []

    listens = (On("post", "step_event", "record", always=True),)

    def record(self, obj: Any) -> None:
        if self.step % self.every == 0:
            self.report()

    def measure(self) -> dict[str, float]:
        """The values now, without recording them."""
        rss = process_rss() or 0
        values = {"rss_mib": rss / _MIB}
        peak = _peak_rss()
        if peak is not None:  # the kernel updates its high-water mark lazily: never below now
            values["peak_rss_mib"] = max(peak, rss) / _MIB
        if self.cuda:
            import torch

            device = self.device
            values["cuda_allocated_mib"] = torch.cuda.memory_allocated(device) / _MIB
            values["cuda_peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / _MIB
            values["cuda_reserved_mib"] = torch.cuda.memory_reserved(device) / _MIB
            values["cuda_peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / _MIB
        return values

    def report(self) -> dict[str, float]:
        """Measure now, log and keep in ``history`` at the current step."""
        values = self.measure()
        if self.cuda and self.reset_peak:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        if self.logger is not None:
            for name, value in values.items():
                self.logger.log(name, value, self.step)
        self.history.append((self.step, values))
        return values

    @property
    def last(self) -> dict[str, float] | None:
        return self.history[-1][1] if self.history else None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "history": [(step, dict(v)) for step, v in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.history = [(step, dict(v)) for step, v in state.get("history", [])]


def process_rss() -> int | None:
    """This process's resident set size in bytes: ``psutil`` where it is installed,
    else ``/proc/self/statm`` (Linux); ``None`` where neither is there."""
    global _PROCESS
    try:
        import psutil
    except ImportError:
        pass
    else:
        if _PROCESS is None or _PROCESS[0] != os.getpid():  # once per process (a fork gets its own)
            _PROCESS = (os.getpid(), psutil.Process())
        return int(_PROCESS[1].memory_info().rss)
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _peak_rss() -> int | None:
    """The most resident memory this process has had, in bytes (``None`` without
    the ``resource`` module: Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # bytes on macOS, KiB elsewhere
