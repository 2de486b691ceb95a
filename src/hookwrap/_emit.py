"""Custom events: ``obj.emit("on_validation_end", metrics=m)`` (Lightning Fabric's
``call``). Each callback gets only the keywords it names; which ones is worked
out once per listener and call shape, not per call (Fabric runs
``inspect.signature`` on every call). The per-call runner is the dispatch's
(``_dispatch.emitter``); this module gathers listeners and plans shapes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ._chains import keep_planning_out_of_traces, plans_out_of_traces
from ._checks import check_event
from ._dispatch import EmitEvent, emitter
from ._policy import EmitStep, MAX_CALL_SHAPES
from ._codegen import emit_runner
from ._owners import class_record, lock
from ._instances import can_hold_state, instance_state
from ._tiers import entries_for
from .errors import HookError, safe_repr
from ._events import CUSTOM
from ._signature import callable_label, callback_parameters

__all__ = ["emit"]


class _Listener:
    __slots__ = ("fn", "label", "names", "required", "gate", "first")

    def __init__(self, fn: Any, gate: Any) -> None:
        self.fn = fn
        self.label = callable_label(fn)
        self.gate = gate
        try:
            params = callback_parameters(fn)
        except (TypeError, ValueError):
            params = []
        self.first = params[0].name if params else None  # receives the emitter
        params = params[1:]
        self.names = tuple(p.name for p in params)
        self.required = frozenset(p.name for p in params if p.default is p.empty)


class EmitPlanner:
    """What ``emit`` asks on a cache miss: an event's listeners (``gather``), what
    each is passed for a call shape (``plan``). Kept out of torch.compile's traces."""

    untraced = False

    @staticmethod
    def gather(target: Any, tp: type, name: str) -> EmitEvent:
        """The listeners of ``name``, kept in the instance's state or the class's
        record until a registration of that event drops them (``_owners``); the
        event is checked when they are gathered, so an unknown one fails on every
        emit."""
        keep_planning_out_of_traces()
        if not isinstance(name, str):
            raise HookError(f"emit({tp.__qualname__}, ...): the event name must be a string like "
                            f"'on_validation_end', got {safe_repr(name)} ({type(name).__name__}).")
        name = str.__str__(name)  # a str subclass's own __hash__/__eq__ never run
        if tp is not target and not can_hold_state(target):
            check_event(tp, CUSTOM, name, _where(tp, name))  # such a class declares no events: raises
        state = None if tp is target else instance_state(target, create=False)
        cache = state.emit_cache if state is not None else class_record(tp).emit_cache  # type: ignore[union-attr]
        event = cache.get(name)
        if event is None:
            check_event(tp, CUSTOM, name, _where(tp, name))
            with lock:  # a registration meanwhile must not be missed
                entries = entries_for(name, True, tp, None, state)
                event = EmitEvent(tuple(_Listener(e.fn, e.options.gate if e.options else None)
                                        for e in entries))
                cache[name] = event
        return cast(EmitEvent, event)

    @staticmethod
    def plan(event: EmitEvent, shape: tuple[str, ...], tp: type, name: str) -> tuple[EmitStep, ...]:
        """What each listener is passed when the keywords ``shape`` are emitted (and
        those steps as the pure twin's straight-line runner); a listener missing a
        keyword it requires fails here, every time."""
        steps = []
        for listener in event.listeners:
            if listener.first in shape and listener.first != "self":
                raise HookError(
                    f"{_where(tp, name)}: callback {listener.label}'s first parameter "
                    f"{listener.first!r} receives the object that emits the event, not the keyword "
                    f"{listener.first!r}. Add `self` before it: "
                    f"`def {getattr(listener.fn, '__name__', 'callback')}(self, {listener.first}, ...)`."
                )
            missing = listener.required.difference(shape)
            if missing:
                raise HookError(
                    f"{_where(tp, name)}: callback {listener.label} needs {', '.join(sorted(missing))}, "
                    f"but the event was emitted with {', '.join(sorted(shape)) or 'no keywords'}. Give "
                    f"those parameters a default, or pass them to emit()."
                )
            names = tuple(k for k in listener.names if k in shape)
            take = None if set(names) == set(shape) else tuple(shape.index(k) for k in names)
            steps.append(EmitStep(listener.fn, listener.gate, take, names, listener.label))
        plan = tuple(steps)
        if len(event.plans) < MAX_CALL_SHAPES:  # past it: planned for this call only
            event.plans[shape] = plan
            event.runners[shape] = emit_runner(plan)  # what the pure twin's emit runs
        return plan


def _where(tp: type, name: str) -> str:
    return f"emit({tp.__qualname__}, {name!r})"


if TYPE_CHECKING:
    def emit(target: Any, name: str, /, **kwargs: Any) -> None:
        """Call the callbacks of custom event ``name`` on ``target``."""
else:
    emit = emitter(EmitPlanner)
plans_out_of_traces(EmitPlanner, "gather", "plan")
