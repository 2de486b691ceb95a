"""Custom events: ``obj.emit("on_validation_end", metrics=m)`` (Lightning Fabric's
``call``). Each callback gets only the keywords it names; which ones is worked
out once per callback, not per call (Fabric runs ``inspect.signature`` on
every call)."""

from __future__ import annotations

from typing import Any, cast

from ._checks import check_event
from ._dispatch import STATE_KEY
from ._owners import RECORD_ATTR, class_record, lock
from ._tiers import entries_for, instance_state
from .errors import CallbackReturnError, HookError, callback_note
from .events import CUSTOM
from .signature import callable_label, callback_parameters

__all__ = ["emit", "emit_with"]

_NO_DICT: dict[str, Any] = {}


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


class _Event:
    """One custom event's listeners on one owner, and a call plan per call shape
    (the keyword names emitted, in order): what each listener is passed."""

    __slots__ = ("listeners", "plans")

    def __init__(self, listeners: tuple[_Listener, ...]) -> None:
        self.listeners = listeners
        self.plans: dict[tuple[str, ...], tuple[tuple[Any, Any, Any, str], ...]] = {}

    def plan(self, shape: tuple[str, ...], where: str) -> tuple[tuple[Any, Any, Any, str], ...]:
        """(fn, gate, the names to pass or None for all of them, label) per listener;
        a listener missing a keyword it requires fails here, every time."""
        steps = []
        for listener in self.listeners:
            missing = listener.required.difference(shape)
            if missing:
                raise HookError(
                    f"{where}: callback {listener.label} needs {', '.join(sorted(missing))}, but "
                    f"the event was emitted with {', '.join(sorted(shape)) or 'no keywords'}. Give "
                    f"those parameters a default, or pass them to emit()."
                )
            names = tuple(k for k in listener.names if k in shape)
            steps.append((listener.fn, listener.gate, None if set(names) == set(shape) else names,
                          listener.label))
        plan = self.plans[shape] = tuple(steps)
        return plan


def _gather(target: Any, tp: type, name: str) -> _Event:
    """The listeners of ``name``, kept in the instance's state or the class's record
    until a registration of that event drops them (``_owners``); the event is
    checked when they are gathered, so an unknown one fails on every emit."""
    state = None if tp is target else instance_state(target, create=False)
    cache = state.emit_cache if state is not None else class_record(tp).emit_cache  # type: ignore[union-attr]
    event = cache.get(name)
    if event is None:
        check_event(tp, CUSTOM, name, _where(tp, name))
        with lock:  # a registration meanwhile must not be missed
            entries = entries_for(name, True, tp, None, state)
            event = _Event(tuple(_Listener(e.fn, e.options.gate if e.options else None)
                                 for e in entries))
            cache[name] = event
    return cast(_Event, event)


def _where(tp: type, name: str) -> str:
    return f"emit({tp.__qualname__}, {name!r})"


def emit(target: Any, name: str, /, **kwargs: Any) -> None:
    """Call the callbacks of custom event ``name`` on ``target``, each with the
    keywords it names (and ``target`` as its first argument). Planned like a join
    point: listeners per owner and event, what to pass per call shape."""
    emit_with(target, name, kwargs)


def emit_with(target: Any, name: str, kwargs: dict[str, Any]) -> None:
    """``emit`` with the keywords as a dict (the mixin's ``emit`` passes its own)."""
    if isinstance(target, type):
        tp = target
        state = None
    else:
        tp = type(target)
        state = getattr(target, "__dict__", _NO_DICT).get(STATE_KEY)
    if state is not None:
        event = state.emit_cache.get(name)
    else:
        record = tp.__dict__.get(RECORD_ATTR)
        event = record.emit_cache.get(name) if record is not None else None
    if event is None:
        event = _gather(target, tp, name)
    shape = tuple(kwargs)
    plan = event.plans.get(shape)
    if plan is None:
        plan = event.plan(shape, _where(tp, name))
    for fn, gate, names, label in plan:
        if gate is not None and not gate.admit(target):
            continue
        try:
            if names is None:  # it takes every keyword emitted
                result = fn(target, **kwargs)
            else:
                result = fn(target, **{k: kwargs[k] for k in names})
        except BaseException as exc:
            exc.add_note(callback_note(label, name))
            raise
        if result is not None:
            raise CallbackReturnError(
                f"callback {label} for custom event {name!r} returned "
                f"{type(result).__name__}; custom event callbacks observe and return None."
            )
