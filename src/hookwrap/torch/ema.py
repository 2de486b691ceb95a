"""``EMA``: an exponential moving average of the weights, swapped in for evaluation."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from ..errors import HookError, SettingError
from ._attach import COUNT, On, Saved, ShippedCallback, saved

# The average as saved: None before the first update, else a list of tensors.
_SHADOW = Saved(lambda value: value is None or (isinstance(value, (list, tuple))
                                                and all(hasattr(t, "detach") for t in value)),
                "None or a list of tensors")

__all__ = ["EMA"]


class EMA(ShippedCallback):
    """Keeps an exponential moving average of ``model``'s parameters, updated after
    each call of ``event`` (default ``"optimizer_step"``), and evaluates with it:
    around each call of ``eval_event`` (default ``"evaluate"``; ``None``: never) the
    averaged weights are copied into the model, and the training weights copied
    back after it returns or raises.

    The average follows ``torch.optim.swa_utils.AveragedModel``: the first update
    copies the weights, each later one does ``ema = decay * ema + (1 - decay) * w``
    for each floating-point parameter (``torch._foreach_mul_`` and
    ``torch._foreach_add_`` under ``no_grad``, on the parameters' device: no host
    read). Buffers (BatchNorm's running statistics) and parameters that are not
    floating point are copied as they are at each update.

    ``model`` is read where the join point has it: its argument of that name, else
    that attribute of the hooked object, or it is the module itself. Callbacks on
    ``pre-``/``post-`` of ``eval_event`` (a checkpoint of the best model) run
    outside the swap and see the training weights; ``with ema.applied(model):``
    swaps the averaged weights in for a block of your own.

    ``state_dict()``/``load_state_dict()`` carry the average, so
    ``hookwrap.callback_state`` saves it; it is loaded onto the model's device at
    the next update or swap.
    """

    def __init__(self, decay: float = 0.999, event: str = "optimizer_step",
                 eval_event: str | None = "evaluate", model: Any = "model") -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay < 1.0:
            raise SettingError(f"EMA: decay must be a number strictly between 0 and 1 (0.999 averages over "
                               f"about 1000 steps), got {decay!r}.")
        for name, value, optional in (("event", event, False), ("eval_event", eval_event, True)):
            if not (isinstance(value, str) and value) and not (optional and value is None):
                raise SettingError(f"EMA: {name} must be the name of a join point"
                                   f"{' or None' if optional else ''}, got {value!r}.")
        if model is None or (isinstance(model, str) and not model):
            raise SettingError(f"EMA: model must be an argument or attribute name, or the module itself, "
                               f"got {model!r}.")
        self.decay = float(decay)
        self.event, self.eval_event, self.model = event, eval_event, model
        self.updates = 0
        self.shadow: list[Any] | None = None  # the model's parameters, then its buffers, averaged
        self._backup: list[Any] | None = None  # the training weights while the average is swapped in
        self._held: Any = None  # the model of the eval_event call starting (pre-, then around-)
        self._placed = True  # False after load_state_dict: move the average to the model's device

    @property
    def where(self) -> str:
        return f"EMA(decay={self.decay})"

    listens = (On("post", "event", "update", value="model", always=True),
               On("pre", "eval_event", "_hold", value="model"),  # eval_event=None: no swap
               On("around", "eval_event", "_swap_method", function="_swap_function"))

    # --- the average ---------------------------------------------------------------

    def update(self, obj: Any, model: Any) -> None:
        """Average ``model``'s current weights in (the first call copies them)."""
        import torch

        averaged, copied, buffers = _tensors(model)
        with torch.no_grad():
            if self.shadow is None:
                self.shadow = [t.detach().clone() for t in averaged + copied + buffers]
                self.updates = 1
                return
            self._check(model, averaged, copied, buffers)
            average = self.shadow[:len(averaged)]
            if average:
                torch._foreach_mul_(average, self.decay)
                torch._foreach_add_(average, averaged, alpha=1.0 - self.decay)
            for dst, src in zip(self.shadow[len(averaged):], copied + buffers):
                dst.copy_(src)
        self.updates += 1

    def _check(self, model: Any, averaged: list[Any], copied: list[Any], buffers: list[Any]) -> None:
        assert self.shadow is not None
        current = averaged + copied + buffers
        if len(current) != len(self.shadow) or any(a.shape != b.shape for a, b in zip(current, self.shadow)):
            raise HookError(f"{self.where}: {type(model).__name__} has {len(current)} parameters and buffers "
                            f"that do not match the {len(self.shadow)} averaged so far: was the model "
                            f"replaced, or a saved average loaded for another one?")
        if not self._placed:
            self.shadow = [s.to(t.device) for s, t in zip(self.shadow, current)]
            self._placed = True

    @contextlib.contextmanager
    def applied(self, model: Any) -> Iterator[None]:
        """A block in which ``model`` holds the averaged weights; the training
        weights are copied back on leaving it, also when it raises. Before the first
        update the model is left as it is."""
        import torch

        if self.shadow is None:
            yield
            return
        averaged, copied, buffers = _tensors(model)
        current = averaged + copied + buffers
        self._check(model, averaged, copied, buffers)
        with torch.no_grad():
            backup = [t.detach().clone() for t in current]
            for dst, src in zip(current, self.shadow):
                dst.copy_(src)
        try:
            yield
        finally:
            with torch.no_grad():
                for dst, src in zip(current, backup):
                    dst.copy_(src)

    # --- evaluation ------------------------------------------------------------------

    def _hold(self, obj: Any, model: Any) -> None:
        self._held = model

    def _swap_method(self, obj: Any, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._swap_function(proceed, *args, **kwargs)

    def _swap_function(self, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        model, self._held = self._held, None
        if model is None:
            return proceed(*args, **kwargs)
        with self.applied(model):
            return proceed(*args, **kwargs)

    # --- resuming ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates,
                "shadow": None if self.shadow is None else [t.clone() for t in self.shadow]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A TypeError, not a HookError: load_callback_state then puts back what it loaded.
        shadow = saved(state, "shadow", _SHADOW, self.where)
        updates = saved(state, "updates", COUNT, self.where)
        self.updates = updates
        self.shadow = None if shadow is None else [t.detach().clone() for t in shadow]
        self._placed = False


def _tensors(model: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """The floating-point parameters (averaged), the other parameters and the
    buffers (copied), each in the module's order."""
    if not callable(getattr(model, "parameters", None)) or not callable(getattr(model, "buffers", None)):
        raise SettingError(f"EMA: the model must be a torch.nn.Module, got {type(model).__name__}.")
    averaged: list[Any] = []
    copied: list[Any] = []
    for p in model.parameters():
        (averaged if p.is_floating_point() or p.is_complex() else copied).append(p.detach())
    return averaged, copied, [b.detach() for b in model.buffers()]

