"""``SpikeDetection``: stop the run when the loss spikes against its running mean."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import sys
from collections import deque
from typing import Any, Callable

from ..errors import SettingError, StopTraining
from ..extend import Ending, JoinPointInfo, per_join_point
from ._attach import COUNT, CountingCallback, DefaultEvent, On, is_rank_zero, loss_reader, saved, whole_number
from .distributed import is_distributed, ranks_where
from .readback import DecidesAtReadBacks, shared

__all__ = ["SpikeDetection", "TrainingSpikeError"]

log = logging.getLogger(__name__)  # under "hookwrap": each spike and the decision taken, at INFO

ACTIONS = ("raise", "stop", "log")


class TrainingSpikeError(RuntimeError):
    """The loss spiked (``SpikeDetection(action="raise")``, as Lightning's
    ``TrainingSpikeException``): ``step`` is the step of the spike, ``bad_steps``
    what it added to ``bad_batches``: that step and the one before it (on a
    framework's preset, that batch and the one before it)."""

    def __init__(self, message: str, step: int, bad_steps: list[int]) -> None:
        super().__init__(message)
        self.step, self.bad_steps = step, bad_steps


# Deferred values are read back (and decided on) at the end of each epoch too.
_READS_AT_EPOCHS = (On("post", "epoch_event", "end_of_epoch"),)


class SpikeDetection(DecidesAtReadBacks, CountingCallback):
    """Lightning's ``SpikeDetection`` (``lightning.fabric.utilities.spike``) on any
    loop: a loss is a spike when it is worse than the last loss counted (``mode``
    ``"min"``: higher) and, against the mean of the last ``window`` losses counted,
    differs by at least ``atol`` and by at least ``rtol`` times that mean (each
    ``None``: no such test); with ``finite_only`` (the default) a NaN or infinite loss
    is a spike too. The first ``warmup`` losses are never spikes; a spike is not
    counted into the mean. The same decisions as Lightning's on the same losses
    (``tests/torch/test_spike.py`` runs both), in float64 where Lightning computes in
    float32: a loss within float32 rounding of the threshold may be decided otherwise.

    The loss is the argument ``argument`` (default ``loss``: ``backward(loss)``) of
    join point ``event`` (default ``"loss"``) where it has one, else what it returns
    (one number: a tensor of one element or a Python number).

    ``action``: ``"raise"`` (Lightning's: ``TrainingSpikeError``, a ``RuntimeError``
    naming the step), ``"stop"`` (``hookwrap.StopTraining``: the loop ends the run
    as for early stopping), or ``"log"`` (a WARNING record under ``hookwrap``, and
    the run goes on). Each spike's step and the one before it are added to
    ``bad_batches`` (steps, 1-based, as counted on ``step_event``; the losses checked
    where the target has no step event; on a framework's preset, where a step is an
    update of several batches, the batch indices as the framework's ``batch_idx``
    numbers them, 0-based over the run, as Lightning's own writes them), and written as a JSON list to
    ``exclude_batches_path`` when given (a file, or a folder to hold
    ``skip_batches.json``; rank 0), to skip them on a resume; Lightning writes it
    to the working directory by default, this only where asked. ``spikes`` lists
    ``(step, loss, running mean)`` of each.

    Without a host sync per step: each loss is queued on its device and read back
    with the other shipped callbacks' values (``hookwrap.torch.readback``) once
    ``check_every`` are queued (at the start of the next step), at the end of each
    ``epoch_event``, and at every boundary of its lifecycle (``hookwrap.extend.Defers``:
    the end of ``fit_event`` however it ends, ``callback_state``, interpreter exit),
    where the losses are decided in order; a spike at the last step is decided at
    the end of ``fit`` and stops it there. So the run stops up to ``check_every - 1``
    steps after the spike, naming its step; with ``action="stop"``, a spike found
    once the run has ended (its last steps) is a WARNING record, as there is nothing
    left to stop (``bad_batches`` holds it). A Python number is decided at once.
    Under torch.distributed each rank decides on its own losses and every rank
    stops when one spiked (one all-reduce per read-back point), as Lightning's.
    """

    def __init__(self, mode: str = "min", window: int = 10, warmup: int = 1, atol: float | None = None,
                 rtol: float | None = 2.0, exclude_batches_path: str | os.PathLike[str] | None = None,
                 finite_only: bool = True, *, event: str = "loss", argument: str = "loss",
                 action: str = "raise", check_every: int = 20,
                 step_event: str | None = DefaultEvent("step"),
                 epoch_event: str | None = DefaultEvent("epoch"),
                 fit_event: str | None = DefaultEvent("fit")) -> None:
        super().__init__(step_event)
        where = "SpikeDetection"
        if mode not in ("min", "max"):
            raise SettingError(f"{where}: mode must be 'min' or 'max', got {mode!r}.")
        self.window = whole_number(window, "window", where)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise SettingError(f"{where}: warmup must be a whole number >= 0 (losses never counted as spikes), "
                               f"got {warmup!r}.")
        for name, value in (("atol", atol), ("rtol", rtol)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise SettingError(f"{where}: {name} must be a finite number or None (no such test), got {value!r}.")
        if not isinstance(finite_only, bool):
            raise SettingError(f"{where}: finite_only must be True or False, got {finite_only!r}.")
        if action not in ACTIONS:
            raise SettingError(f"{where}: action must be one of {', '.join(map(repr, ACTIONS))}, got {action!r}.")
        if not isinstance(event, str) or not event:
            raise SettingError(f"{where}: event must be a join point name such as 'loss', got {event!r}.")
        if exclude_batches_path is not None and not isinstance(exclude_batches_path, (str, os.PathLike)):
            raise SettingError(f"{where}: exclude_batches_path must be a path or None, got {exclude_batches_path!r}.")
        self.mode, self.warmup, self.atol, self.rtol = mode, warmup, atol, rtol
        self.finite_only, self.action = finite_only, action
        self.exclude_batches_path = exclude_batches_path
        self.event, self.argument = event, argument
        self.check_every = whole_number(check_every, "check_every", where)
        self.epoch_event, self.fit_event = epoch_event, fit_event
        self.run_event = fit_event
        # What Lightning keeps: the last loss counted, the window of the running mean
        # ((sum, weight) per loss, as torchmetrics' Running(MeanMetric): a NaN weighs 0).
        self.last_value = 0.0
        self._window: deque[tuple[float, float]] = deque(maxlen=self.window)
        self.seen = 0  # losses decided (Lightning's batch_idx is the next one's)
        self.bad_batches: list[int] = []
        self.spikes: list[tuple[int, float, float]] = []
        # The deferred queue: losses are numbered as checked, delivered in any order
        # (CUDA copies complete apart), decided in order.
        self._queued = 0  # losses checked
        self._next = 1  # the number of the next loss to decide
        self._arrived: dict[int, tuple[int, float]] = {}  # number -> (step, value)
        # A spike decided, not yet acted on: (step, loss, running mean, the bad_batches it added).
        self._found: tuple[int, float, float, tuple[int, int]] | None = None
        self._run_over = False  # settling at the run's end: action="stop" has nothing left to stop

    label = ("event",)

    @property
    def state_key(self) -> str:
        return f"SpikeDetection[{self.event}]"

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        self.wants(target, self.event)
        pairs: list[tuple[str, Callable[..., Any]]] = [
            (f"post-{self.event}", per_join_point(self, "check", self._choose))]
        self._steps_counted = self.wants(target, self.step_event)
        pairs += self.registrations(target, _READS_AT_EPOCHS)
        self.wants(target, self.fit_event)  # a boundary (Defers): checked here, a name must exist
        return pairs

    def _choose(self, jp: JoinPointInfo) -> Any:
        return loss_reader(self.where, jp, self.argument, self.check,
                           "Pass event= the join point that computes the loss, or argument= the name of the "
                           "argument that carries it.")

    # --- per loss: queued, never read here ----------------------------------------------

    def check(self, obj: Any, value: Any) -> None:
        """One loss: queued on its device (a Python number: decided at once)."""
        number = self._queued + 1
        step = self.step if self._steps_counted else number
        tensor = hasattr(value, "detach")
        if tensor and value.numel() != 1:
            raise SettingError(f"{self.where}: the loss must be one number, got a tensor of shape "
                               f"{tuple(value.shape)} at step {step}. Watch the join point returning the "
                               f"reduced loss.")
        if not tensor and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SettingError(f"{self.where}: the loss must be a tensor of one element or a number, got "
                               f"{type(value).__name__} at step {step}.")
        self._queued = number
        if tensor:
            shared().put(value, functools.partial(self._delivered, number, step))
        else:
            self._arrived[number] = (step, float(value))
            if not is_distributed():
                self._since += 1
                self._checked_on = id(obj)
                self._read_back(wait=True)  # a number: decided now, after the tensors before it
                return
        self.queued(obj)  # read back once check_every are queued

    def _delivered(self, number: int, step: int, values: list[float]) -> None:
        self._arrived[number] = (step, values[0])  # decided at the read-back point (this must not raise)

    def _count_step(self, obj: Any) -> None:
        self.read_if_due()  # check_every losses queued in the steps before this one
        self.step += 1

    # --- deciding, in order, at read-back points ------------------------------------------

    def _decide_arrived(self) -> None:
        while self._found is None and self._next in self._arrived:
            step, value = self._arrived.pop(self._next)
            self._next += 1
            self._decide(step, value)
        if self._found is not None:  # the run stops there: later losses are not its own
            self._arrived.clear()
            self._next = self._queued + 1

    def _decide(self, step: int, value: float) -> None:
        """Lightning's ``on_train_batch_end``, on one loss."""
        index, self.seen = self.seen, self.seen + 1
        running = self.running_mean()
        if index >= self.warmup and self._is_spike(value, running):
            # On a framework the batches to skip are its batch_idx (0-based, as Lightning's
            # SpikeDetection writes them): a step there is an update of several batches.
            bad = (index - 1, index) if self._axis is not None else (step - 1, step)
            self.bad_batches.extend(bad)
            self.spikes.append((step, value, running))
            if self.action == "log":
                self._write_bad_batches()
                log.warning("%s", self._message(step, value, running, bad) + " Going on (action='log').")
            else:
                self._found = (step, value, running, bad)
        elif self.finite_only or math.isfinite(value):
            self._window.append((0.0, 0.0) if math.isnan(value) else (value, 1.0))  # torchmetrics drops NaN
            self.last_value = value

    def running_mean(self) -> float:
        """The mean of the last ``window`` losses counted (NaN before any)."""
        weight = sum(w for _, w in self._window)
        return sum(s for s, _ in self._window) / weight if weight else math.nan

    def _is_spike(self, value: float, running: float) -> bool:
        if self.finite_only and not math.isfinite(value):
            return True
        diff = value - self.last_value
        if (diff <= 0) if self.mode == "min" else (diff >= 0):
            return False
        off = abs(value - running)
        return (self.atol is None or off >= abs(self.atol)) and (self.rtol is None or off >= abs(self.rtol * running))

    def _message(self, step: int, value: float, running: float, bad: tuple[int, int]) -> str:
        tests = " and ".join(f"{name}={tol}" for name, tol in (("atol", self.atol), ("rtol", self.rtol))
                             if tol is not None) or "no tolerance"
        said = "steps" if self._axis is None else "batches (batch_idx, 0-based)"
        return (f"SpikeDetection: the loss spiked at step {step}: {value:.6g} against a running mean of "
                f"{running:.6g} over the last {len(self._window)} losses ({tests}, mode={self.mode!r}); "
                f"{said} {bad[0]} and {bad[1]} are in bad_batches.")

    def _read_back(self, wait: bool) -> None:
        """A read-back point: read the queued losses, decide them in order, and act on
        a spike (under torch.distributed: on any rank, with one all-reduce)."""
        distributed = is_distributed()
        if not self._pending() and not distributed and self._found is None:
            return
        if distributed and not self._since and not wait:
            return  # the same on every rank: nothing checked since the last point
        self._since, self._due = 0, False
        shared().read(wait=wait or distributed)
        self._decide_arrived()
        found, self._found = self._found, None
        if distributed:
            ranks = ranks_where(found is not None)
            if ranks and found is None:
                on = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
                self._act(f"SpikeDetection: the loss spiked on {on} (not on this one).", None)
            if ranks:
                assert found is not None
                self._act(self._message(*found), found[0], found[3])
        elif found is not None:
            self._act(self._message(*found), found[0], found[3])

    def _pending(self) -> int:
        return self._queued - self._next + 1

    def _act(self, message: str, step: int | None, bad: tuple[int, int] | None = None) -> None:
        self._write_bad_batches()
        if self._run_over:
            log.warning("%s Found as the run ended: nothing left to stop.", message)
            return
        log.info("%s Stopping the run (action=%r).", message, self.action)
        if self.action == "stop":
            raise StopTraining(message)
        raise TrainingSpikeError(message, step if step is not None else self.step, list(bad or ()))

    def _write_bad_batches(self) -> None:
        if self.exclude_batches_path is None or not is_rank_zero():
            return
        path = os.fspath(self.exclude_batches_path)
        if not path.endswith(".json"):
            path = os.path.join(path, "skip_batches.json")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.bad_batches, f, indent=4)
        log.info("SpikeDetection: wrote the steps to skip, %s, to %s", self.bad_batches, path)

    # --- the lifecycle --------------------------------------------------------------------

    def settle(self, obj: Any, ending: Ending) -> None:
        """A boundary (``hookwrap.extend.Defers``): decide every loss queued; when an
        error is leaving, note a spike found on it instead."""
        if not ending.failed:
            # A StopTraining after the run's end would leave `fit` itself: the run is over.
            self._run_over = self.action == "stop" and (ending.run_ended or ending.where == "removed")
            try:
                self._read_back(wait=True)
            finally:
                self._run_over = False
            return
        assert ending.exception is not None
        try:
            shared().read(wait=True)
        except Exception:  # noqa: BLE001 - the device may be what failed: keep its error
            pass
        self._decide_arrived()
        found, self._found = self._found, None
        self._arrived.clear()
        self._next, self._since, self._due = self._queued + 1, 0, False
        if found is not None:
            note = f"{self._message(*found)} (found as this error ended the run)"
            ending.exception.add_note(note)
            if not isinstance(ending.exception, Exception):
                print(f"hookwrap: {note}", file=sys.stderr)

    def pending(self) -> str:
        count = self._pending()
        return f"{count} losses not yet checked for spikes" if count else ""

    def undecided(self) -> int:
        return self._pending()

    # --- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "seen": self.seen, "last_value": self.last_value,
                "window": [list(pair) for pair in self._window], "bad_batches": list(self.bad_batches)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        seen = saved(state, "seen", COUNT, self.where)
        last, window, bad = state["last_value"], state["window"], state["bad_batches"]
        if not isinstance(last, (int, float)) or isinstance(last, bool):
            raise TypeError(f"{self.where}: the saved 'last_value' must be a number, got {last!r}")
        if not isinstance(window, list) or not all(
                isinstance(pair, (list, tuple)) and len(pair) == 2
                and all(isinstance(x, (int, float)) for x in pair) for pair in window):
            raise TypeError(f"{self.where}: the saved 'window' must be a list of [sum, weight] pairs, got {window!r}")
        if not isinstance(bad, list) or not all(isinstance(x, int) for x in bad):
            raise TypeError(f"{self.where}: the saved 'bad_batches' must be a list of steps, got {bad!r}")
        super().load_state_dict(state)
        self.seen, self.last_value = seen, float(last)
        self._window = deque(((float(s), float(w)) for s, w in window), maxlen=self.window)
        self.bad_batches = list(bad)
