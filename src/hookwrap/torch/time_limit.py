"""``TimeLimit``: end the run when its time budget is spent (Lightning's ``Timer(duration=...)``)."""

from __future__ import annotations

import logging
import math
import re
import time
from datetime import timedelta
from typing import Any, Callable

from ..errors import HookError, SettingError, StopTraining
from ._attach import DefaultEvent, On, ShippedCallback
from .distributed import is_distributed, ranks_where

__all__ = ["TimeLimit"]

log = logging.getLogger(__name__)  # under "hookwrap": the decision to stop, at INFO

INTERVALS = ("step", "epoch")


def duration_seconds(duration: Any, where: str) -> float:
    """``duration`` as seconds: a number of seconds, a ``timedelta``, a mapping of
    ``timedelta``'s keywords (``{"hours": 2}``) or a ``"DD:HH:MM:SS"`` string (as
    Lightning's ``Timer`` reads them); > 0, else a HookError naming it."""
    seconds: Any = None
    if isinstance(duration, str):
        match = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", duration.strip())
        if match:
            days, hours, minutes, secs = map(int, match.groups())
            seconds = timedelta(days=days, hours=hours, minutes=minutes, seconds=secs).total_seconds()
    elif isinstance(duration, timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, dict):
        try:
            seconds = timedelta(**duration).total_seconds()
        except TypeError:
            seconds = None
    elif isinstance(duration, (int, float)) and not isinstance(duration, bool):
        seconds = float(duration)
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise SettingError(f"{where}: duration must be a time > 0: seconds (a number), a datetime.timedelta, "
                           f"a dict of timedelta's keywords ({{'hours': 2}}) or a 'DD:HH:MM:SS' string "
                           f"('00:12:00:00'), got {duration!r}.")
    return float(seconds)


class TimeLimit(ShippedCallback):
    """Raises ``hookwrap.StopTraining`` once the run has trained for ``duration``
    (seconds, a ``timedelta``, a dict of its keywords, or ``"DD:HH:MM:SS"``), as
    Lightning's ``Timer(duration=..., interval=...)`` does: checked after each call
    of ``step_event`` (``interval="step"``, the default) or of ``epoch_event``
    (``interval="epoch"``), so the step or epoch under way completes first. (The
    name: ``StepTimer`` already times each step.)

    The time counted is that inside ``fit_event`` (each call of it adds to the
    budget spent; a loop with no ``fit`` counts from the first step or epoch on),
    read from ``clock`` (default ``time.monotonic``; a function returning seconds).
    ``state_dict`` holds the time spent, so a resumed run continues the budget
    (Lightning's ``time_elapsed``); a resume whose budget is already spent stops
    before its first step (or epoch) runs. The decision is logged at INFO. Under
    torch.distributed the ranks stop together: every check is one all-reduce
    (any rank over the limit stops all, and the others' message names it), as
    Lightning broadcasts rank 0's.
    ``time_elapsed()`` and ``time_remaining()`` say where the budget stands.
    """

    def __init__(self, duration: Any, interval: str = "step", *,
                 step_event: str | None = DefaultEvent("step"),
                 epoch_event: str | None = DefaultEvent("epoch"),
                 fit_event: str | None = DefaultEvent("fit"),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.duration = duration_seconds(duration, "TimeLimit")
        if interval not in INTERVALS:
            raise SettingError(f"TimeLimit: interval must be 'step' or 'epoch' (when the time is checked), "
                               f"got {interval!r}.")
        if not callable(clock):
            raise SettingError(f"TimeLimit: clock must be a function returning seconds (time.monotonic), "
                               f"got {clock!r}.")
        self.interval, self.clock = interval, clock
        self.step_event, self.epoch_event, self.fit_event = step_event, epoch_event, fit_event
        self.checked_event = step_event if interval == "step" else epoch_event
        self._spent = 0.0  # seconds counted before the current stretch (earlier fits, a resumed run)
        self._since: float | None = None  # clock() when the current stretch began
        self._first = True  # the first check of a stretch comes before its first step
        self.stopped_at: float | None = None  # the time spent when it stopped the run

    @property
    def where(self) -> str:
        return f"TimeLimit(duration={self.duration:g}s, interval={self.interval!r})"

    @property
    def state_key(self) -> str:
        return "TimeLimit"

    listens = (On("around", "fit_event", "_run_method", function="_run_function"),
               On("pre", "checked_event", "_before", always=True),
               On("post", "checked_event", "_after", always=True))

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        if self.checked_event is None or not self.wants(target, self.checked_event):
            setting = "step_event" if self.interval == "step" else "epoch_event"
            raise HookError(f"{self.where}: the target has no {setting} join point ({self.checked_event!r}) "
                            f"to check the time after, so it would never stop the run. Name yours "
                            f"({setting}=...), or pass interval={'epoch' if self.interval == 'step' else 'step'!r}.")
        return self.registrations(target, self.listens)

    # --- the clock ------------------------------------------------------------------------

    def time_elapsed(self) -> float:
        """Seconds of training counted so far (a resumed run's included)."""
        since = self._since
        return self._spent + (self.clock() - since if since is not None else 0.0)

    def time_remaining(self) -> float:
        """Seconds left of ``duration`` (negative once it is spent)."""
        return self.duration - self.time_elapsed()

    def _run_method(self, obj: Any, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._run_function(proceed, *args, **kwargs)

    def _run_function(self, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        outer = self._since is None
        if outer:
            self._since, self._first = self.clock(), True
        try:
            return proceed(*args, **kwargs)
        finally:
            if outer:
                self._spent, self._since = self.time_elapsed(), None

    def _before(self, obj: Any) -> None:
        if self._since is None:  # no fit join point: the run counts from its first step
            self._since = self.clock()
        if self._first:
            self._first = False
            self._check()  # a resumed run whose budget is spent: stop before it trains

    def _after(self, obj: Any) -> None:
        self._check()

    def _check(self) -> None:
        elapsed = self.time_elapsed()
        over = elapsed >= self.duration
        where = ""
        if is_distributed():  # one all-reduce: any rank over the limit stops every rank, at this check
            ranks = ranks_where(over)
            if ranks and not over:
                where = f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} (not on this one)"
            over = bool(ranks)
        if over:
            self.stopped_at = elapsed
            stop = StopTraining(f"TimeLimit: the time limit of {timedelta(seconds=self.duration)} is reached"
                                f"{where} ({elapsed:.1f} s trained); stopping the run.")
            log.info("%s", stop)
            raise stop

    # --- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": self.time_elapsed()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        elapsed = state["time_elapsed"]
        if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not elapsed >= 0:
            raise TypeError(f"{self.where}: the saved 'time_elapsed' must be a number of seconds >= 0, "
                            f"got {elapsed!r}")
        self._spent = float(elapsed)
        if self._since is not None:  # loaded mid-run (at fit's start): the stretch starts now
            self._since = self.clock()
