"""``callback_state(obj)`` / ``load_callback_state(obj, state)``: save and resume the
state of every callback attached to an object, so a resumed run continues its
early-stopping counters, best scores and step counts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._describe import describe
from ._lifecycle import Ending, settle_attached
from .errors import HookError

__all__ = ["CallbackState", "callback_state", "load_callback_state", "stateful_callbacks"]


def stateful_callbacks(obj: Any, where: str = "stateful_callbacks") -> dict[str, Any]:
    """``state_key -> callback`` for each callback object with ``state_dict()`` attached
    to ``obj`` in any tier, in chain order. A key taken already gets ``#2``, ``#3``, ...
    (two callbacks of one class and settings, in the order they were attached)."""
    try:
        owners = describe(obj).callback_objects()
    except HookError as exc:  # told as this function's error: the object is what was passed
        raise HookError(f"{where}({type(obj).__qualname__}): {exc}") from None
    found = [cb for cb in owners if callable(getattr(cb, "state_dict", None))
             and callable(getattr(cb, "load_state_dict", None))]
    keyed: dict[str, Any] = {}
    for cb in found:
        base = getattr(cb, "state_key", type(cb).__qualname__)
        key, n = base, 1
        while key in keyed:
            n += 1
            key = f"{base}#{n}"
        keyed[key] = cb
    return keyed


def callback_state(obj: Any) -> dict[str, Any]:
    """The ``state_dict()`` of every stateful callback attached to ``obj``, by
    ``state_key``. Save it beside the model's: ``torch.save({"model": ...,
    "callbacks": hookwrap.callback_state(trainer)}, path)``.

    What a deferring callback attached to ``obj`` still holds is settled first
    (``hookwrap.extend.Defers``): a NaN check still queued raises here, as it
    would have later in the run, rather than being lost with the process."""
    settle_attached(obj, Ending("state"))
    return {key: cb.state_dict() for key, cb in stateful_callbacks(obj, "callback_state").items()}


def load_callback_state(obj: Any, state: dict[str, Any], strict: bool = True) -> None:
    """Give each callback attached to ``obj`` its saved state. With ``strict`` (the
    default), a saved state that no attached callback takes, or an attached stateful
    callback with no saved state, is an error: attach the same callbacks, in the same
    order, before loading."""
    if not isinstance(state, dict):
        raise HookError(f"load_callback_state: expected the dict callback_state() returned, "
                        f"got {type(state).__name__}.")
    attached = stateful_callbacks(obj, "load_callback_state")
    unused = sorted(set(state) - set(attached))
    missing = sorted(set(attached) - set(state))
    if strict and (unused or missing):
        raise HookError(
            f"load_callback_state({type(obj).__qualname__}): "
            + (f"saved state for {', '.join(map(repr, unused))}, which no attached callback takes"
               if unused else "")
            + ("; " if unused and missing else "")
            + (f"no saved state for attached {', '.join(map(repr, missing))}" if missing else "")
            + ". Attach the same callbacks as when the state was saved before loading, or pass "
            "strict=False to load what matches."
        )
    for key in attached:
        if key in state and not isinstance(state[key], Mapping):
            raise HookError(
                f"load_callback_state({type(obj).__qualname__}): the state saved for {key!r} is a "
                f"{type(state[key]).__name__}, not the dict its state_dict() returns. Load the "
                f"'callbacks' entry that hookwrap.callback_state() saved."
            )
    before = {key: cb.state_dict() for key, cb in attached.items() if key in state}
    loaded: list[str] = []
    for key, cb in attached.items():
        if key not in state:
            continue
        try:
            cb.load_state_dict(state[key])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            for done in loaded + [key]:  # all or nothing: the callbacks as they were
                attached[done].load_state_dict(before[done])
            raise HookError(
                f"load_callback_state({type(obj).__qualname__}): {key!r} could not load its saved "
                f"state ({type(exc).__name__}: {exc}); nothing was loaded. Was it saved from a "
                f"callback of the same kind and version?"
            ) from exc
        loaded.append(key)


class CallbackState:
    """The callbacks attached to ``obj`` as one object with ``state_dict()`` and
    ``load_state_dict(state)``, for checkpoint systems that save such objects beside
    the model: ignite's ``Checkpoint(to_save={..., "hookwrap": CallbackState(trainer)})``,
    ``accelerator.register_for_checkpointing(CallbackState(accelerator))``, Fabric's
    ``fabric.save(path, {..., "hookwrap": CallbackState(fabric)})``. Each call reads or
    loads the callbacks attached at that moment (``callback_state``,
    ``load_callback_state``, strict)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def state_dict(self) -> dict[str, Any]:
        return callback_state(self.obj)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_callback_state(self.obj, state)

    def __repr__(self) -> str:
        return f"hookwrap.CallbackState({type(self.obj).__qualname__})"
