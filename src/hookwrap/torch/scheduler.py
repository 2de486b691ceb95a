"""``StepScheduler``: a learning-rate scheduler stepped where the loop's updates are,
without a line of the loop changed (Lightning's ``interval="step"``/``"epoch"``)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..errors import HookError, SettingError
from ._attach import COUNT, CountingCallback, DefaultEvent, On, from_object, saved, whole_number

__all__ = ["StepScheduler"]

_INTERVALS = ("step", "epoch")


class StepScheduler(CountingCallback):
    """Calls ``scheduler.step()`` after every ``frequency``-th update (``interval="step"``:
    each call of ``event``, default ``"optimizer_step"``; on a framework's preset one
    optimizer update, so under gradient accumulation once per update, never per
    micro-batch) or epoch (``interval="epoch"``: each call of ``epoch_event``), as
    Lightning steps a scheduler configured with that ``interval`` and ``frequency``.
    A warm-up then a decay is one scheduler: ``SequentialLR([LinearLR(...),
    CosineAnnealingLR(...)], milestones=[warmup])``.

    ``scheduler``: the scheduler itself, the hooked object's attribute of that name
    (``"scheduler"``), or the script's global (``"__main__:scheduler"``, under
    ``hookwrap run``). A ``ReduceLROnPlateau`` steps on a metric, not a count: it is
    refused when first met, naming Lightning's and the loop's ways. Its state is the
    scheduler's own: ``Checkpoint(scheduler=...)`` saves and restores it."""

    def __init__(self, scheduler: Any = "scheduler", interval: str = "step", frequency: int = 1,
                 event: str = "optimizer_step", epoch_event: str = DefaultEvent("epoch"),
                 step_event: str | None = DefaultEvent("step")) -> None:
        super().__init__(step_event)
        where = "StepScheduler"
        if interval not in _INTERVALS:
            raise SettingError(f"{where}: interval must be 'step' (after each update) or 'epoch' (after each "
                               f"epoch), got {interval!r}.")
        if scheduler is None or isinstance(scheduler, (int, float, bool)):
            raise SettingError(f"{where}: scheduler must be the LR scheduler, the name of the hooked object's "
                               f"attribute holding it, or '__main__:NAME', got {scheduler!r}.")
        for setting, value in (("event", event), ("epoch_event", epoch_event)):
            if not isinstance(value, str) or not value:
                raise SettingError(f"{where}: {setting} must be a join point name, got {value!r}.")
        self.scheduler, self.interval = scheduler, interval
        self.frequency = whole_number(frequency, "frequency", where)
        self.event, self.epoch_event = event, epoch_event
        self.calls = 0  # updates (or epochs) seen since the last scheduler step
        self.stepped = 0  # scheduler steps taken

    listens = (On("post", "event", "advance", always=True),)
    listens_by_epoch = (On("post", "epoch_event", "advance", always=True),)

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        return self.registrations(target, self.listens if self.interval == "step" else self.listens_by_epoch)

    def advance(self, obj: Any) -> None:
        self.calls += 1
        if self.calls < self.frequency:
            return
        self.calls = 0
        scheduler = from_object(obj, self.scheduler, "scheduler", "StepScheduler")
        if not callable(getattr(scheduler, "step", None)) or isinstance(scheduler, torch.optim.Optimizer):
            raise HookError(f"StepScheduler: scheduler={self.scheduler!r} is a {type(scheduler).__name__}, not an "
                            f"LR scheduler (it has no step()). Pass the scheduler, or the attribute that holds it.")
        if type(scheduler).__name__ == "ReduceLROnPlateau":
            raise SettingError(
                "StepScheduler: a ReduceLROnPlateau steps on a metric (scheduler.step(val_loss)), not on a count. "
                "Step it where the metric is computed: after your evaluation, or on Lightning with "
                "configure_optimizers' {'scheduler': ..., 'monitor': 'val_loss'}.")
        scheduler.step()
        self.stepped += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "calls": self.calls, "stepped": self.stepped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        calls, stepped = saved(state, "calls", COUNT, self.where), saved(state, "stepped", COUNT, self.where)
        super().load_state_dict(state)
        self.calls, self.stepped = calls, stepped
