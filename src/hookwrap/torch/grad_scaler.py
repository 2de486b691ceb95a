"""``GradScaler``: float16 loss scaling (``torch.amp.GradScaler``) on the loop's join points."""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Iterator

from ..errors import CallbackSignatureError, HookError, SettingError
from ..extend import JoinPointInfo
from ._attach import COUNT, On, ShippedCallback, checked_device_type, framework_step, from_object, saved

__all__ = ["GradScaler", "scale_of_gradients", "unscale_before_clipping"]

log = logging.getLogger(__name__)  # under "hookwrap": each skipped optimizer step, at INFO

# The scalers whose loss was scaled and whose gradients are not unscaled yet: GradClip
# (and GradAccumulation's clip_grad_norm) unscale them first, whatever the order the
# callbacks were attached in. Weak: a scaler nothing else holds is not kept for this.
_DUE: weakref.WeakSet[GradScaler] = weakref.WeakSet()

# `_scaled_on` when no loss is scaled: None is a function join point's object.
_NOT_SCALED = object()


def unscale_before_clipping(obj: Any) -> None:
    """Before gradients are clipped (or read) on hooked object ``obj`` (None on a
    function join point): each GradScaler that scaled the loss of ``obj`` since its
    last optimizer step unscales its optimizer's gradients now
    (``scaler.unscale_(optimizer)``), as a hand-written ``torch.amp`` loop does before
    ``clip_grad_norm_``. Nothing to do (one set lookup) without one."""
    if not _DUE:
        return
    for scaler in list(_DUE):
        if scaler._scaled_on is obj:
            scaler.unscale(obj)


def scale_of_gradients(obj: Any) -> Any:
    """The factor the gradients of hooked object ``obj`` (None on a function join
    point) are scaled by now: the scale tensor of the GradScaler that scaled the loss
    of ``obj`` and has not unscaled its gradients yet (on the device, never read to
    the host), else None (no GradScaler, or the gradients already unscaled: by
    GradClip, or by ``scaler.step``). ``GradNorm`` divides its norm by it, so it
    reports the true norm without unscaling early (``unscale_`` may run once per
    optimizer step, and with accumulation the next ``backward`` adds scaled
    gradients). Nothing to do (one set lookup) without one.

    On a framework that scales the loss itself (HF ``fp16=True``, Lightning
    ``16-mixed``, Fabric, accelerate ``mixed_precision="fp16"``), its preset says
    where its ``torch.amp.GradScaler`` is (``FRAMEWORK_SCALER``): its scale, until it
    unscales the gradients itself before clipping or stepping."""
    if _DUE:
        for scaler in list(_DUE):
            if scaler._scaled_on is obj:
                return scaler.scaler._scale  # what scaler.scale(loss) multiplied by: set from then on
    find = getattr(type(obj), FRAMEWORK_SCALER, None) if obj is not None else None
    return None if find is None else _scale_before_unscaling(find(obj))


# What a preset sets on the framework's class it weaves when the framework scales the
# loss with a torch.amp.GradScaler (hookwrap.integrations._weaving.scales_loss writes the
# same name): a function of the hooked object giving that scaler, or None.
FRAMEWORK_SCALER = "__hookwrap_grad_scaler__"


def _scale_before_unscaling(scaler: Any) -> Any:
    """``scaler``'s scale tensor while the gradients it scaled are still scaled: None
    when there is no scaler, it is disabled, has scaled nothing yet, or has unscaled
    an optimizer's gradients since its last step (``unscale_`` before clipping)."""
    if scaler is None or not getattr(scaler, "_enabled", False) or getattr(scaler, "_scale", None) is None:
        return None
    states = getattr(scaler, "_per_optimizer_states", {})
    if any(state.get("stage") is not None and state["stage"].name == "UNSCALED" for state in states.values()):
        return None
    return scaler._scale


class GradScaler(ShippedCallback):
    """Float16 training with ``torch.amp.GradScaler``, woven into the loop as the
    hand-written loop does it::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer); clip_grad_norm_(...)   # where GradClip clips
        scaler.step(optimizer)                              # skipped when not finite
        scaler.update()

    * before ``backward_event`` (default ``"backward"``), its argument ``loss`` is
      replaced by ``scaler.scale(loss)`` (the loss the ``loss`` join point returns,
      and what loggers and ``NanGuard`` read there, stay unscaled);
    * ``GradClip`` (and ``GradAccumulation(clip_grad_norm=...)``) unscale the
      gradients first (``scaler.unscale_(optimizer)``), in whichever order the
      callbacks were attached, so they clip the true gradients;
    * around ``event`` (default ``"optimizer_step"``), the optimizer's ``step()`` runs
      through ``scaler.step(optimizer)``, which unscales (where nothing did), and skips
      the step when a gradient is inf or NaN; then ``scaler.update()`` backs the
      scale off (a skipped step) or grows it (``growth_interval`` good steps). Where
      ``event`` is the optimizer's own ``step`` (``weave_optimizers("optimizer_step")``),
      the join point is what is skipped; where it is a method of the loop
      (``optimizer.step(); optimizer.zero_grad()``, the example trainer's), only the
      ``optimizer.step()`` call inside it is, and the rest of the method (zeroing
      the gradients, an LR scheduler) runs as in the hand-written loop.

    ``optimizer`` (default ``"optimizer"``): the hooked object's attribute of that
    name, the hooked object itself when it is the optimizer, the optimizer itself, or
    ``"__main__:NAME"``. ``backward_event=None``: the loop scales the loss itself
    (``gradscaler.scale(loss).backward()``). ``scaler``: a ``torch.amp.GradScaler`` of
    yours, else one made for ``device`` (``"cuda"``, ``"cpu"``, ...) with
    ``init_scale``, ``growth_factor``, ``backoff_factor`` and ``growth_interval``.

    ``skipped`` lists the optimizer-step calls (1-based) whose step was skipped
    (each logged at INFO); ``state_dict`` holds the scaler's own ``state_dict()`` (the
    scale and its growth tracker), so a resumed run scales as the original would.
    ``scaler.step`` reads one flag back per step (a host sync), as torch's does.

    Refused on a framework's preset (transformers, Lightning, Fabric, accelerate):
    each scales the loss itself in float16 (``TrainingArguments(fp16=True)``,
    ``precision="16-mixed"``, ``Accelerator(mixed_precision="fp16")``), around an
    optimizer step of its own; a second scaler would scale twice.
    """

    def __init__(self, device: str = "cuda", *, event: str = "optimizer_step",
                 backward_event: str | None = "backward", optimizer: Any = "optimizer",
                 scaler: Any = None, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        import torch
        import torch.amp

        for name, value in (("event", event), ("backward_event", backward_event)):
            if not (isinstance(value, str) and value) and not (name == "backward_event" and value is None):
                raise SettingError(f"GradScaler: {name} must be a join point name"
                                   f"{' or None (the loop scales the loss itself)' if name == 'backward_event' else ''}"
                                   f", got {value!r}.")
        if optimizer is None or (isinstance(optimizer, str) and not optimizer):
            raise SettingError(f"GradScaler: optimizer must be the name of the attribute holding the optimizer "
                               f"('optimizer'), or the optimizer itself, got {optimizer!r}.")
        if scaler is None:
            checked_device_type(device, _scaler_device, "GradScaler", "device",
                                "torch.amp.GradScaler supports ('cuda', 'cpu', ...)",
                                "torch's GradScaler would disable itself and scale nothing; pass device='cpu' on "
                                "the CPU")
            try:
                scaler = torch.amp.GradScaler(device, init_scale=init_scale, growth_factor=growth_factor,
                                              backoff_factor=backoff_factor, growth_interval=growth_interval)
            except (TypeError, ValueError, AssertionError) as exc:
                raise HookError(f"GradScaler: torch.amp.GradScaler refused the settings: {exc}") from None
        elif not isinstance(scaler, torch.amp.GradScaler):
            raise SettingError(f"GradScaler: scaler must be a torch.amp.GradScaler, got {scaler!r}.")
        if not scaler.is_enabled():
            raise HookError("GradScaler: the torch.amp.GradScaler given is disabled (enabled=False, or made "
                            "for CUDA where there is none), so it would scale nothing. Pass an enabled one.")
        self.scaler = scaler
        self.event, self.backward_event, self.optimizer = event, backward_event, optimizer
        self.calls = 0  # calls of `event` that stepped (or skipped) through the scaler
        self.skipped: list[int] = []  # which of them were skipped (inf or NaN gradients)
        # The hooked object whose loss is scaled, its gradients not yet unscaled: the object
        # itself, not its id(), which a later object may reuse once a run is collected.
        self._scaled_on: Any = _NOT_SCALED
        self._unscaled: Any = None  # the optimizer unscaled since the last update

    label = ("event",)
    keyed_by_label = True

    listens = (On("pre", "backward_event", "_scale_method", choose="_choose_scale", always=True),
               On("around", "event", "_step_method", function="_step_function", always=True))

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        if framework_step(target, self.event, self.where) is not None:  # it scales the loss itself
            raise HookError(
                f"GradScaler: {getattr(target, '__qualname__', 'the framework')} runs its own optimizer step "
                f"and scales the loss itself in float16: use its setting (transformers: "
                f"TrainingArguments(fp16=True); Lightning and Fabric: precision='16-mixed'; accelerate: "
                f"Accelerator(mixed_precision='fp16')). A second scaler here would scale twice.")
        declared = self.listens if self.backward_event is not None else self.listens[1:]
        return self.registrations(target, declared)

    # --- scaling the loss --------------------------------------------------------------

    def scale(self, loss: Any, obj: Any = None) -> Any:
        """``scaler.scale(loss)``, its gradients then due to be unscaled before they are
        clipped (for the loop that scales its loss itself: ``backward_event=None``).
        Refused once the gradients were unscaled and not yet stepped: the new, scaled
        gradients would add to unscaled ones, and the step would mix both scales."""
        if self._unscaled is not None:
            raise HookError(
                f"{self.where}: a loss scaled for backward after the gradients were unscaled (to clip them) and "
                f"before the optimizer step: the new gradients, scaled, would add to the unscaled ones. Gradients "
                f"that accumulate are clipped once, before the step: GradAccumulation(steps, clip_grad_norm=...) "
                f"instead of GradClip, or clip after the last backward of each step.")
        self._scaled_on = obj
        _DUE.add(self)
        return self.scaler.scale(loss)

    def _choose_scale(self, jp: JoinPointInfo) -> Callable[..., Any]:
        if "loss" not in jp.arguments:
            raise CallbackSignatureError(
                f"{self.where}: {jp.where} has no argument 'loss' to scale (its arguments: "
                f"{', '.join(jp.arguments) or 'none'}). Pass backward_event= the join point called with the "
                f"loss as `loss`, or backward_event=None and scale it in the loop: gradscaler.scale(loss).backward().")
        return self._scale_method if jp.has_object else self._scale_function

    def _scale_method(self, obj: Any, loss: Any) -> Any:
        return self.scale(loss, obj)

    def _scale_function(self, loss: Any) -> Any:
        return self.scale(loss)

    def unscale(self, obj: Any = None) -> None:
        """``scaler.unscale_(optimizer)`` now, once between two optimizer steps (the
        optimizer read from ``obj``, the hooked object)."""
        _DUE.discard(self)
        self._scaled_on = _NOT_SCALED
        optimizer = from_object(obj, self.optimizer, "optimizer", self.where)
        if self._unscaled is not optimizer:
            self.scaler.unscale_(optimizer)
            self._unscaled = optimizer

    # --- the optimizer step ------------------------------------------------------------

    def _step_method(self, obj: Any, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        optimizer = from_object(obj, self.optimizer, "optimizer", self.where)
        if optimizer is obj:  # the optimizer's own step is the join point: proceed is the step
            return self._through_scaler(optimizer, proceed, args, kwargs)
        return self._around_loop(optimizer, proceed, args, kwargs)

    def _step_function(self, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._around_loop(from_object(None, self.optimizer, "optimizer", self.where), proceed, args, kwargs)

    def _around_loop(self, optimizer: Any, proceed: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
        """The loop's own method runs; its ``optimizer.step()`` runs through the scaler."""
        real_step = optimizer.step  # what the loop would call: the method, or a wrapper (an LR scheduler's)
        stepped: list[bool] = []

        def step_through_scaler(*a: Any, **kw: Any) -> Any:
            stepped.append(True)
            with _instance_step(optimizer, real_step):  # scaler.step calls optimizer.step: the real one
                return self._scaler_step(optimizer, a, kw, update=False)

        with _instance_step(optimizer, step_through_scaler):
            result = proceed(*args, **kwargs)
        if stepped:
            self._update()
        return result

    def _through_scaler(self, optimizer: Any, proceed: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> Any:
        def real_step(*a: Any, **kw: Any) -> Any:
            return proceed(*a, **kw)

        with _instance_step(optimizer, real_step):
            return self._scaler_step(optimizer, args, kwargs, update=True)

    def _scaler_step(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any], update: bool) -> Any:
        """``scaler.step(optimizer, *args, **kwargs)``, ``optimizer.step`` being the real
        step for the call; then ``scaler.update()`` where ``update``."""
        _DUE.discard(self)
        self._scaled_on = _NOT_SCALED
        self.calls += 1
        ran: list[bool] = []
        vars(optimizer)["step"] = _Recording(vars(optimizer)["step"], ran)
        try:
            result = self.scaler.step(optimizer, *args, **kwargs)
        finally:
            vars(optimizer)["step"] = vars(optimizer)["step"].step
        if not ran:
            self.skipped.append(self.calls)
            log.info("%s: optimizer step %d skipped: its gradients were inf or NaN (the scale backs off)",
                     self.where, self.calls)
        if update:
            self._update()
        return result

    def _update(self) -> None:
        self._unscaled = None
        self.scaler.update()

    # --- state -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict(), "calls": self.calls, "skipped": list(self.skipped)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        calls = saved(state, "calls", COUNT, self.where)
        skipped = state["skipped"]
        scaler = state["scaler"]
        if not isinstance(skipped, list) or not all(COUNT.check(call) for call in skipped):
            raise TypeError(f"{self.where}: the saved 'skipped' must be a list of whole numbers, got {skipped!r}")
        if not isinstance(scaler, Mapping) or "scale" not in scaler:
            raise TypeError(f"{self.where}: the saved 'scaler' must be a torch.amp.GradScaler state_dict(), "
                            f"got {scaler!r}")
        self.scaler.load_state_dict(dict(scaler))
        self.calls, self.skipped = calls, [int(call) for call in skipped]


class _Recording:
    """An optimizer's ``step`` that notes it ran (so a skipped step is known without
    reading the scaler's private state)."""

    def __init__(self, step: Callable[..., Any], ran: list[bool]) -> None:
        self.step, self.ran = step, ran

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.ran.append(True)
        return self.step(*args, **kwargs)


_MISSING = object()


@contextlib.contextmanager
def _instance_step(optimizer: Any, step: Callable[..., Any]) -> Iterator[None]:
    """``optimizer.step`` is ``step`` in the block (an attribute of the instance), and
    as it was after: the class's method, or the wrapper an LR scheduler put there."""
    before = vars(optimizer).get("step", _MISSING)
    vars(optimizer)["step"] = step
    try:
        yield
    finally:
        if before is _MISSING:
            vars(optimizer).pop("step", None)
        else:
            vars(optimizer)["step"] = before


def _scaler_device(device: str) -> bool:
    import torch

    try:
        return bool(torch.device(device).type == device)
    except RuntimeError:
        return False
