"""``GradClip`` and ``GradAccumulation``: callbacks that change the loop.

They change what the loop does rather than watch it: ``GradClip`` rewrites the
gradients after ``backward``; ``GradAccumulation`` scales the loss the join point
``loss`` returns and, as around advice, lets the optimizer step through only every
``steps`` calls. Written, like every shipped callback, on the public API and
``hookwrap.extend`` alone.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import CallbackSignatureError, HookError, SettingError
from ..extend import JoinPointInfo
from ._attach import (COUNT, On, ShippedCallback, framework_grad_norm, framework_step,
                      from_object, positive_number, saved)
from .grad_scaler import FRAMEWORK_SCALER, scale_of_gradients, unscale_before_clipping

__all__ = ["GradAccumulation", "GradClip"]


class GradClip(ShippedCallback):
    """After each call of ``event`` (default ``"backward"``), clips the gradients of
    ``model`` in place with ``torch.nn.utils.clip_grad_norm_(model.parameters(),
    max_norm, norm_type)``: their total ``norm_type`` norm is scaled down to at most
    ``max_norm``. ``model`` is read from the join point's argument of that name,
    else the hooked object's attribute (``trainer.model``), or is the module itself.

    The norm is computed and applied on the device; nothing is read back to the host
    (no ``.item()``), so clipping never waits for the device. Use it as the loop
    written by hand would: clip after ``backward``, before ``optimizer_step``.
    Beside ``GradAccumulation`` it would clip after every ``backward``, the sum so
    far each time: to clip the accumulated sum once, before the optimizer step (as
    Lightning and transformers do), pass ``clip_grad_norm=`` to ``GradAccumulation``
    instead."""

    def __init__(self, max_norm: float, norm_type: float = 2.0, event: str = "backward",
                 model: Any = "model") -> None:
        self.max_norm = positive_number(max_norm, "max_norm", "GradClip")
        self.norm_type = positive_number(norm_type, "norm_type", "GradClip", allow_inf=True)
        if not isinstance(event, str) or not event:
            raise SettingError(f"GradClip: event must be a join point name such as 'backward', got {event!r}.")
        self.event, self.model = event, model

    listens = (On("post", "event", "clip", value="model", always=True),)

    def clip(self, obj: Any, model: Any) -> None:
        import torch

        declared = type(obj)  # a preset's declarations (a plain loop's: None, on Hookable)
        if framework_grad_norm(obj) is not None:
            raise HookError(
                f"GradClip on {type(obj).__qualname__}: DeepSpeed holds the gradients and updates "
                f"with them itself (ZeRO partitions them: p.grad is empty or partial), so there is nothing here "
                f"to clip. "
                f"Clip with DeepSpeed: \"gradient_clipping\" in its config (TrainingArguments(max_grad_norm=...) "
                f"on HF's Trainer).")
        unscale_before_clipping(obj)  # a GradScaler's gradients: unscaled first, so the true norm is clipped
        if getattr(declared, FRAMEWORK_SCALER, None) is not None and scale_of_gradients(obj) is not None:
            # still scaled: by the framework's own GradScaler
            raise HookError(
                f"GradClip on {type(obj).__qualname__}: the framework scaled these gradients with its own "
                f"GradScaler (float16) and unscales them only when it steps; clipped now, the update would be "
                f"clipped to max_norm divided by the scale. Clip with the framework (DeepSpeed: "
                f"\"gradient_clipping\" in its config; accelerate: accelerator.clip_grad_norm_).")
        torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_norm, self.norm_type)


class GradAccumulation(ShippedCallback):
    """Gradient accumulation over ``steps`` calls: the loss is scaled by ``1/steps``
    (after join point ``loss_event``, default ``"loss"``, its return value is replaced
    by ``return_value / steps``), and join point ``event`` (default
    ``"optimizer_step"``) runs only on every ``steps``-th call: around advice that
    calls ``proceed`` on calls ``steps``, ``2*steps``, ... and skips the others
    (returning ``None``).

    The assumption, which the example trainer meets: the gradients are zeroed
    inside the ``event`` join point (``optimizer.step()`` then
    ``optimizer.zero_grad()``), or nowhere else, so that skipping it lets
    ``backward`` add up the gradients of ``steps`` calls. A loop that zeroes them
    before each ``backward``, outside that join point, would throw the sum away:
    move its ``zero_grad`` into the optimizer-step join point (or hook it as part
    of it). With that, the weights are those of the hand-written loop:

        loss = loss_fn(model(x), y) / steps
        loss.backward()
        if (i + 1) % steps == 0:
            optimizer.step(); optimizer.zero_grad()

    ``clip_grad_norm=max_norm`` clips the accumulated gradients of ``model`` (the
    hooked object's attribute of that name, or the module itself) once, right
    before each optimizer step it lets through, with
    ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)``,
    on the device (no host read), as the hand-written loop does:

    ```python
    if (i + 1) % steps == 0:
        clip_grad_norm_(model.parameters(), max_norm); optimizer.step(); ...
    ```

    On a framework's preset (transformers, Lightning, accelerate) it is refused:
    the framework zeroes the gradients outside its optimizer step, so use its own
    accumulation (``gradient_accumulation_steps``, ``accumulate_grad_batches``),
    whose steps the presets count as the updates they are.

    Callbacks after it on ``post-<loss_event>`` (loggers) see the scaled loss;
    calls left over at the end of the run (fewer than ``steps``) are not stepped.
    ``calls`` (the optimizer-step calls seen) is saved with ``state_dict`` for a
    resume."""

    def __init__(self, steps: int, event: str = "optimizer_step", loss_event: str = "loss", *,
                 clip_grad_norm: float | None = None, norm_type: float = 2.0, model: Any = "model") -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise SettingError(f"GradAccumulation: steps must be a whole number >= 1 (the calls of the "
                               f"optimizer step accumulated into one), got {steps!r}.")
        for name, value in (("event", event), ("loss_event", loss_event)):
            if not isinstance(value, str) or not value:
                raise SettingError(f"GradAccumulation: {name} must be a join point name, got {value!r}.")
        self.steps, self.event, self.loss_event = steps, event, loss_event
        self.clip_grad_norm = None if clip_grad_norm is None else \
            positive_number(clip_grad_norm, "clip_grad_norm", "GradAccumulation")
        self.norm_type = positive_number(norm_type, "norm_type", "GradAccumulation", allow_inf=True)
        if not isinstance(model, str) and not callable(getattr(model, "parameters", None)):
            raise SettingError(f"GradAccumulation: model must be the name of the attribute holding the model "
                               f"('model') or the module itself, got {model!r}.")
        self.model = model
        self.calls = 0  # calls of `event` seen

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        own = framework_step(target, self.event, self.where)
        if own is not None:
            raise HookError(
                f"GradAccumulation: {getattr(target, '__qualname__', 'the framework')} accumulates gradients "
                f"itself, and zeroes them "
                f"outside its optimizer step: skipping that step here would throw the gradients away (or, "
                f"with its own accumulation on, accumulate twice). Use the framework's: {own}.")
        return self.registrations(target, self.listens)  # event checked above, loss_event here

    listens = (On("post", "loss_event", "scale", choose="_choose_scale", always=True),
               On("around", "event", "accumulate", choose="_choose_around", always=True))

    def _choose_scale(self, jp: JoinPointInfo) -> Callable[..., Any]:
        if jp.returns_none:
            raise CallbackSignatureError(f"{self.where}: {jp.where} returns None; the loss to scale must "
                                         f"be what it returns. Pass loss_event= the join point returning the loss.")
        return self.scale if jp.has_object else self.scale_function

    def _choose_around(self, jp: JoinPointInfo) -> Callable[..., Any]:
        if self.clip_grad_norm is not None and isinstance(self.model, str) and not jp.has_object:
            raise CallbackSignatureError(
                f"{self.where}: {jp.where} is a function, with no object to read the model from as "
                f"attribute {self.model!r} for clip_grad_norm. Pass model= the module itself.")
        return self.accumulate if jp.has_object else self.accumulate_function

    def scale(self, obj: Any, return_value: Any) -> Any:
        return return_value / self.steps

    def scale_function(self, return_value: Any) -> Any:
        return return_value / self.steps

    def accumulate(self, obj: Any, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        # Read on every call, so a misnamed model fails at the first, not the first step.
        model = None if self.clip_grad_norm is None else from_object(obj, self.model, "model", self.where)
        if self.calls % self.steps:
            return None
        if model is not None and self.clip_grad_norm is not None:
            import torch

            unscale_before_clipping(obj)
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip_grad_norm, self.norm_type)
        return proceed(*args, **kwargs)

    def accumulate_function(self, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.accumulate(None, proceed, *args, **kwargs)

    @property
    def state_key(self) -> str:
        return f"GradAccumulation[event={self.event}]"

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = saved(state, "calls", COUNT, self.where)
