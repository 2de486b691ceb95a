"""Termination signals caught for ``Checkpoint(on_signal=...)``: the handler only
notes the signal; the checkpoint saves at the next safe point of the loop, then
``finish`` hands the signal on as the process would have had it.

Why not save in the handler: a Python signal handler runs between two bytecodes
of the main thread, in the middle of whatever the loop was doing (half an
optimizer step, a collective, a ``torch.save`` of its own). The state there is not
one a resume can continue from; the end of the step is.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

from ..errors import HookError, SettingError
from ..extend import signal_course

__all__ = ["Caught", "signal_numbers"]


def signal_numbers(signals: Any, where: str) -> tuple[int, ...]:
    """``signals`` (one signal or several: ``signal.SIGTERM``, ``"SIGUSR1"``, 15) as
    signal numbers, else a HookError naming the setting."""
    if isinstance(signals, (int, str)):
        signals = (signals,)
    try:
        given = list(signals)
    except TypeError:
        raise SettingError(f"{where}: on_signal must be a signal or a tuple of them "
                           f"(signal.SIGTERM, 'SIGUSR1'), got {signals!r}.") from None
    numbers: list[int] = []
    valid = signal.valid_signals()
    for one in given:
        number: Any = one
        if isinstance(one, str):
            number = getattr(signal, one if one.startswith("SIG") else f"SIG{one}", None)
        if isinstance(number, bool) or not isinstance(number, int) or number not in valid:
            raise HookError(f"{where}: on_signal: {one!r} is not a signal of this platform. Pass "
                            f"signal.SIGTERM, signal.SIGUSR1 (SLURM's --signal=USR1@90) or their names.")
        if number in (signal.SIGKILL if hasattr(signal, "SIGKILL") else -1,
                      signal.SIGSTOP if hasattr(signal, "SIGSTOP") else -1):
            raise HookError(f"{where}: on_signal: {signal.Signals(number).name} cannot be caught; "
                            f"nothing can save on it.")
        if int(number) not in numbers:
            numbers.append(int(number))
    if not numbers:
        raise HookError(f"{where}: on_signal names no signal; pass signal.SIGTERM, or leave it None.")
    return tuple(numbers)


class Caught:
    """The signals of one ``Checkpoint``: installed for a run (``install``), noted
    when one comes (``signum``), put back (``restore``)."""

    def __init__(self, numbers: tuple[int, ...], where: str) -> None:
        self.numbers, self.where = numbers, where
        self.signum: int | None = None  # the first signal caught since install
        self.previous: dict[int, Any] = {}  # signal -> the handler installed before ours

    def __getstate__(self) -> dict[str, Any]:
        # A copy (torch.save of the hooked object) holds the settings, not this process's handlers.
        return {"numbers": self.numbers, "where": self.where, "signum": None, "previous": {}}

    def _handler(self, signum: int, frame: Any) -> None:
        # Only a flag: the save waits for the next safe point (see the module's docstring).
        if self.signum is None:
            self.signum = signum

    def install(self) -> None:
        """Our handler for each signal, the previous one kept. Refused off the main
        thread, where Python cannot set a signal handler."""
        if threading.current_thread() is not threading.main_thread():
            raise HookError(
                f"{self.where}: on_signal installs signal handlers, which Python allows in the main "
                f"thread only, and fit runs in thread {threading.current_thread().name!r}. Run fit in the "
                f"main thread, or leave on_signal=None and install a handler there yourself.")
        if self.previous:
            return  # installed already (a nested fit)
        self.signum = None
        for number in self.numbers:
            self.previous[number] = signal.signal(number, self._handler)

    def restore(self) -> None:
        """The handlers as they were before ``install``."""
        previous, self.previous = self.previous, {}
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)

    def finish(self, signum: int) -> None:
        """After the save: the previous handlers back, then the signal handed on as
        the process would have had it without us: a previous Python handler is
        called (it may requeue, raise or exit); with the default action (terminate)
        the run ends with ``SystemExit(128 + signum)``, the status a shell reports
        for a process a signal ended, unwinding so that ``finally`` blocks and the
        deferred callbacks' ends still run; an ignored signal lets the run go on."""
        # hookwrap's own handler (delivering held values) is passed over: this save's
        # SystemExit unwinds through the run's boundaries, which deliver them.
        previous = signal_course(signum, self.previous.get(signum, signal.SIG_DFL))
        self.restore()
        if callable(previous):
            handler: Callable[[int, Any], Any] = previous
            handler(signum, None)
            return
        if previous == signal.SIG_IGN:
            return
        raise SystemExit(128 + signum)
