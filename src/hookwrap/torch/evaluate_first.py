"""``EvaluateFirst``: an evaluation before the first step (HF's ``eval_on_start``)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ..errors import HookError, SettingError
from ..extend import join_points
from ._attach import DefaultEvent, On, ShippedCallback

__all__ = ["EvaluateFirst"]


class EvaluateFirst(ShippedCallback):
    """Before the first ``step_event`` of each run (each ``fit_event`` call; without
    one, the first step ever), evaluates once by calling the hooked object's
    ``event`` join point (default ``"evaluate"``) with no arguments, as HF's
    ``TrainingArguments(eval_on_start=True)`` does: what evaluations feed
    (``EarlyStopping``, ``BestCheckpoint``, ``MetricsLogger``, the framework's own
    log, set up by then) starts from the untrained model's value, at step 0. The
    evaluation is a call like any other of that join point: every callback on it
    runs. Refused when attached where the evaluation needs arguments, or has no
    object to call it on."""

    def __init__(self, event: str = "evaluate", fit_event: str = DefaultEvent("fit"),
                 step_event: str = DefaultEvent("step")) -> None:
        for setting, value in (("event", event), ("fit_event", fit_event), ("step_event", step_event)):
            if not isinstance(value, str) or not value:
                raise SettingError(f"EvaluateFirst: {setting} must be a join point name, got {value!r}.")
        self.event, self.fit_event, self.step_event = event, fit_event, step_event
        self._method: str = event  # the name of the method the join point is (HF: evaluate)
        self._armed = True  # no evaluation yet in this run
        self.evaluations = 0

    label = ("event",)
    listens = (On("pre", "fit_event", "arm"), On("pre", "step_event", "evaluate_now", always=True))

    def arm(self, obj: Any) -> None:
        self._armed = True

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        if target is not None:
            for jp in join_points(target, self.event, where=self.where):
                if not jp.has_object:
                    raise HookError(f"{self.where}: {self.event!r} is a function join point, with no object to "
                                    f"call it on. Evaluate first yourself, before the loop, or weave the method "
                                    f"that evaluates.")
                required = [p.name for p in list(inspect.signature(jp.function).parameters.values())[1:]
                            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                                   p.KEYWORD_ONLY)]
                if required:
                    raise HookError(f"{self.where}: {self.event!r} needs {', '.join(required)}, and it is called "
                                    f"with none. Give them defaults, or evaluate first yourself.")
                self._method = jp.function.__name__
        return self.registrations(target, self.listens)

    def evaluate_now(self, obj: Any) -> None:
        if not self._armed:
            return
        self._armed = False
        if obj is None:
            raise HookError(f"{self.where}: the step ({self.step_event!r}) is a function, with no object whose "
                            f"{self.event!r} to call. Evaluate first yourself, before the loop.")
        modes = _training_modes(obj)
        try:
            getattr(obj, self._method)()
        finally:
            for module, training in modes:  # an evaluate() that switched to eval() leaves training as it was
                module.training = training
        self.evaluations += 1


def _training_modes(obj: Any) -> list[tuple[Any, bool]]:
    """Each module of ``obj`` (itself, if it is one, and its attributes that are),
    with its ``training`` flag now."""
    import torch

    tops = ([obj] if isinstance(obj, torch.nn.Module) else []) + \
        [value for value in vars(obj).values() if isinstance(value, torch.nn.Module)]
    seen: dict[int, tuple[Any, bool]] = {}
    for top in tops:
        for module in top.modules():
            seen.setdefault(id(module), (module, module.training))
    return list(seen.values())
