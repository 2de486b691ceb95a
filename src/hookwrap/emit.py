"""Custom events: ``obj.emit("on_validation_end", metrics=m)`` (Lightning Fabric's
``call``). Each callback gets only the keywords it names; which ones is worked
out once per callback, not per call (Fabric runs ``inspect.signature`` on
every call)."""

from __future__ import annotations

from typing import Any

from ._checks import check_event
from ._owners import class_record, lock
from ._tiers import entries_for, instance_state
from .errors import CallbackReturnError, HookError, callback_note
from .events import CUSTOM
from .signature import callable_label, callback_parameters

__all__ = ["emit"]


class _Listener:
    __slots__ = ("fn", "label", "names", "required", "gate")

    def __init__(self, fn: Any, gate: Any) -> None:
        self.fn = fn
        self.label = callable_label(fn)
        self.gate = gate
        try:
            params = callback_parameters(fn)[1:]  # first: the emitter
        except (TypeError, ValueError):
            params = []
        self.names = tuple(p.name for p in params)
        self.required = frozenset(p.name for p in params if p.default is p.empty)


def _listeners(target: Any, tp: type, name: str) -> tuple[_Listener, ...]:
    """The listeners of ``name``, kept in the instance's state or the class's record
    until a registration of that event drops them (``_owners``)."""
    state = None if isinstance(target, type) else instance_state(target, create=False)
    cache = state.emit_cache if state is not None else class_record(tp).emit_cache  # type: ignore[union-attr]
    listeners = cache.get(name)
    if listeners is None:
        with lock:  # a registration meanwhile must not be missed
            entries = entries_for(name, True, tp, None, state)
            listeners = tuple(_Listener(e.fn, e.options.gate if e.options else None) for e in entries)
            cache[name] = listeners
    return listeners


def emit(target: Any, name: str, /, **kwargs: Any) -> None:
    """Call the callbacks of custom event ``name`` on ``target``, each with the
    keywords it names (and ``target`` as its first argument)."""
    tp = target if isinstance(target, type) else type(target)
    where = f"emit({tp.__qualname__}, {name!r})"
    check_event(tp, CUSTOM, name, where)
    for listener in _listeners(target, tp, name):
        if listener.gate is not None and not listener.gate.admit(target):
            continue
        missing = listener.required.difference(kwargs)
        if missing:
            raise HookError(
                f"{where}: callback {listener.label} needs {', '.join(sorted(missing))}, but the "
                f"event was emitted with {', '.join(sorted(kwargs)) or 'no keywords'}. Give those "
                f"parameters a default, or pass them to emit()."
            )
        passed = {k: kwargs[k] for k in listener.names if k in kwargs}
        try:
            result = listener.fn(target, **passed)
        except BaseException as exc:
            exc.add_note(callback_note(listener.label, name))
            raise
        if result is not None:
            raise CallbackReturnError(
                f"callback {listener.label} for custom event {name!r} returned "
                f"{type(result).__name__}; custom event callbacks observe and return None."
            )
