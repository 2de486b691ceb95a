"""``EarlyStopping``: end the run when a monitored metric stops improving."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

from ..errors import SettingError, StopTraining
from ._attach import COUNT, DefaultEvent, framework_reading, saved, whole_number
from ._best import MonitoredCallback

__all__ = ["EarlyStopping"]

log = logging.getLogger(__name__)  # under "hookwrap": the decision to stop, at INFO


class EarlyStopping(MonitoredCallback):
    """Raises ``hookwrap.StopTraining`` when ``monitor`` has not improved by more
    than ``min_delta`` for ``patience`` calls of ``event`` in a row.

    ``monitor`` is read from join point ``event`` (default ``"evaluate"``): an argument
    of that name, its ``return_value``, or a key of the mapping it returns.

    ``min_delta`` as Lightning's and Keras' ``EarlyStopping`` read it: a value within
    ``min_delta`` of the best is no improvement, and the best stays. HF's
    ``EarlyStoppingCallback(early_stopping_threshold=...)`` reads it otherwise: such a
    value still becomes the best (``state.best_metric``), so slow steady gains stop a
    run sooner. ``small_gains_set_best=True`` decides as HF does; by default (``None``)
    it is what the framework attached to does: True on the transformers preset, False
    elsewhere.

    ``stopping_threshold``: a value better than it (``mode="min"``: below) is good
    enough, and stops the run at once; ``divergence_threshold``: a value worse than it
    (above) is hopeless, and stops it too. Both as Lightning's ``EarlyStopping``
    decides them, before patience.

    The loop
    ends the run by catching the exception:

        try:
            for epoch in range(epochs):
                ...
                self.evaluate(val_loader)
        except hookwrap.StopTraining as stop:
            print(stop)
    """

    def __init__(self, monitor: str = "val_loss", mode: str = "min", patience: int = 3,
                 min_delta: float = 0.0, event: str = "evaluate",
                 step_event: str | None = DefaultEvent("step"), small_gains_set_best: bool | None = None,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None) -> None:
        self.patience = whole_number(patience, "patience", "EarlyStopping")
        for setting, value in (("stopping_threshold", stopping_threshold),
                               ("divergence_threshold", divergence_threshold)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise SettingError(f"EarlyStopping: {setting} must be a finite number or None, got {value!r}.")
        crossed = stopping_threshold is not None and divergence_threshold is not None and (
            stopping_threshold >= divergence_threshold if mode == "min" else stopping_threshold <= divergence_threshold)
        if crossed:
            raise SettingError(f"EarlyStopping: stopping_threshold={stopping_threshold} (good enough) must be "
                               f"{'below' if mode == 'min' else 'above'} divergence_threshold={divergence_threshold} "
                               f"(hopeless) with mode={mode!r}.")
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        if small_gains_set_best is not None and not isinstance(small_gains_set_best, bool):
            raise SettingError(f"EarlyStopping: small_gains_set_best must be True, False, or None (as the framework "
                               f"attached to decides), got {small_gains_set_best!r}.")
        self._small_gains_setting = small_gains_set_best
        self.small_gains_set_best = bool(small_gains_set_best)  # resolved when attached
        self._reads_per_object = False
        self.wait = 0  # calls since the last improvement
        super().__init__(monitor, mode, min_delta, event, step_event)

    label = ("monitor",)

    @property
    def state_key(self) -> str:
        return f"EarlyStopping[monitor={self.monitor},mode={self.best.mode}]"

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        setting = self._small_gains_setting
        self.small_gains_set_best = framework_reading(target, "small_gains_set_best", False) \
            if setting is None else setting
        self._reads_per_object = setting is None and target is None  # the global tier: each trainer's own
        return super().attach(target)

    def judge(self, obj: Any, current: float) -> None:
        """Lightning's order: the value good enough (``stopping_threshold``) or hopeless
        (``divergence_threshold``, beyond it in the wrong direction) stops the run at
        once, before patience is counted; neither changes the best."""
        below = self.best.mode == "min"
        sign = "<" if below else ">"
        threshold = self.stopping_threshold
        if threshold is not None and (current < threshold if below else current > threshold):
            self._stop(f"{self.monitor} reached the stopping threshold: {current:.6g} {sign} {threshold}.")
        threshold = self.divergence_threshold
        if threshold is not None and (current > threshold if below else current < threshold):
            self._stop(f"{self.monitor} diverged: {current:.6g} {'>' if below else '<'} the divergence threshold "
                       f"{threshold}.")
        super().judge(obj, current)

    def _stop(self, why: str) -> None:
        stop = StopTraining(f"EarlyStopping: {why}")
        log.info("stopping at step %d: %s", self.step, stop)
        raise stop

    def improved(self, obj: Any, value: float) -> None:
        self.wait = 0

    def not_improved(self, obj: Any, value: float) -> None:
        small_gains_set_best = framework_reading(obj, "small_gains_set_best", False) \
            if self._reads_per_object else self.small_gains_set_best
        if small_gains_set_best and self.best.beats(value):  # HF: within min_delta, still the best
            self.best.value, self.best_step = value, self.step
        self.wait += 1
        if self.wait >= self.patience:
            self._stop(f"{self.monitor} has not improved by more than {self.best.min_delta} for {self.wait} "
                       f"evaluations (best {self.best.value:.6g} at step {self.best_step}, now {value:.6g}).")

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        wait = saved(state, "wait", COUNT, self.where)  # checked before anything is set
        super().load_state_dict(state)
        self.wait = wait
