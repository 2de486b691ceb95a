"""``Autocast``: chosen join points run under ``torch.autocast``."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import SettingError
from ..extend import JoinPointInfo, reader
from ._attach import On, ShippedCallback, checked_device_type, event_names

__all__ = ["Autocast"]


class Autocast(ShippedCallback):
    """Runs each call of the join points ``events`` (default ``("step",)``) under
    ``torch.autocast(device_type, dtype)``, as around advice: the forward pass and
    loss inside them compute in ``dtype`` where autocast applies.

    ``device_type`` (``"cpu"``, ``"cuda"``, ...) defaults to the device of the
    first parameter of ``model`` at each call: the join point's argument of that
    name, else that attribute of the hooked object, or the module itself; ``"cpu"``
    where there is none. ``dtype`` defaults to ``torch.bfloat16`` on the CPU and
    ``torch.float16`` on CUDA (torch's autocast default elsewhere). Float16 wants
    loss scaling for the backward pass: attach ``hookwrap.torch.GradScaler`` beside
    it.
    """

    def __init__(self, events: Any = ("step",), device_type: str | None = None, dtype: Any = None,
                 model: Any = "model") -> None:
        import torch

        events = event_names(events, "Autocast")
        if device_type is not None:
            checked_device_type(device_type, _autocast_available, "Autocast", "device_type",
                                "torch.autocast supports ('cpu', 'cuda', ...) or None for the model's",
                                "torch.autocast would silently do nothing")
        if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
            raise SettingError(f"Autocast: dtype must be torch.float16, torch.bfloat16 or None for the "
                               f"device's default, got {dtype!r}.")
        if model is None or (isinstance(model, str) and not model):
            raise SettingError(f"Autocast: model must be an argument or attribute name, or the module itself, "
                               f"got {model!r}.")
        self.events: tuple[str, ...] = events
        self.device_type, self.dtype, self.model = device_type, dtype, model
        self._held: Any = None  # the model of the call starting (its pre-, then its around-)

    label = ("events",)

    # On each of its events: the model held before the call (device_type=None: its
    # device read at each call), then the call run under torch.autocast.
    listens = (On("pre", "event", "_hold", choose="_choose", always=True),
               On("around", "event", "_run_method", function="_run_function", always=True))

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        declared = self.listens if self.device_type is None else self.listens[1:]
        return [pair for event in self.events for pair in self.registrations(target, declared, {"event": event})]

    def _choose(self, jp: JoinPointInfo) -> Any:
        if not isinstance(self.model, str):
            return reader(self._hold, "pre-", None, (self.model,))
        if self.model in jp.arguments:
            return reader(self._hold, "pre-", self.model)
        return reader(self._hold_attribute, "pre-")  # None on a function: the CPU

    def _hold(self, obj: Any, model: Any) -> None:
        self._held = model

    def _hold_attribute(self, obj: Any) -> None:
        assert isinstance(self.model, str)
        self._held = getattr(obj, self.model, None) if obj is not None else None

    def settings(self, model: Any = None) -> tuple[str, Any]:
        """The ``(device_type, dtype)`` a call runs under, for ``model`` (or none)."""
        import torch

        device_type = self.device_type
        if device_type is None:
            parameters = getattr(model, "parameters", None)
            first = next(iter(parameters()), None) if callable(parameters) else None
            device_type = first.device.type if first is not None else "cpu"
        dtype = self.dtype
        if dtype is None:
            dtype = {"cpu": torch.bfloat16, "cuda": torch.float16}.get(device_type) \
                or torch.get_autocast_dtype(device_type)
        return device_type, dtype

    def _run_method(self, obj: Any, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._run_function(proceed, *args, **kwargs)

    def _run_function(self, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import torch

        # The pre- reader of this same call left the model in _held just before.
        model, self._held = self._held, None
        device_type, dtype = self.settings(model)
        with torch.autocast(device_type, dtype=dtype):
            return proceed(*args, **kwargs)


def _autocast_available(device_type: str) -> bool:
    import torch

    try:
        return bool(torch.amp.is_autocast_available(device_type))
    except RuntimeError:  # not a device type at all: "gpu0"
        return False
