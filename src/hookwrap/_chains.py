"""What a call or an emit runs, built on a cache miss, in pure Python: a join
point's chain, and a custom event's listeners and plans.

The dispatch module keeps one chain per join point as its hot cache and asks
the ``PLANNER`` it was built with on a miss. Built chains are kept on their
owner's record (``_owners``): the class the chain is for, the function, or the
instance (``HookState.chains``). Steps are planned once per registration and
join point, and kept on the registration, so rebuilding a chain after another
registration reads no signature again.

A join point's hot cache holds its last chain, and so its last class,
strongly: the identity check on every call needs a strong reference (a weak
one costs ~35 ns a call in the pure twin). Classes are freed by the cyclic
collector; before each full collection, ``_release_hot_caches`` empties every
hot cache, so a class nothing else uses is freed by that collection.

Custom events: ``obj.emit("on_validation_end", metrics=m)`` (Lightning Fabric's
``call``). Each callback gets only the keywords it names; which ones is worked
out once per listener and call shape, not per call (Fabric runs
``inspect.signature`` on every call). The per-call runner is the dispatch's
(``_dispatch.emitter``); ``EmitPlanner`` gathers listeners and plans shapes.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import sys
from typing import TYPE_CHECKING, Any, Iterator, cast

from ._asyncgen import run_chain_async, run_chain_async_generator, run_chain_generator
from ._dispatch import Chain, EmitEvent, emitter
from ._entries import CUSTOM, normalize
from ._fast_py import emit_runner
from ._joinpoints import (
    PHASE_CODES,
    all_join_points,
    callable_label,
    callback_parameters,
    check_event,
    fires,
    fitting_step,
    planned_step,
    spec_of,
)
from ._owners import GLOBAL, class_record, function_record, lock
from ._registry import GLOBAL_TIER, can_hold_state, check_class_tier, entries_for, instance_state
from ._rules import AROUND, ERROR, FUNCTION, MAX_CALL_SHAPES, METHOD, POST, PRE, EmitStep
from ._traced import install, note_planned, traced_dispatch
from .errors import HookError, safe_repr

__all__ = [
    "PLANNER",
    "Planner",
    "emit",
    "hooks_off",
    "keep_planning_out_of_traces",
    "plans_out_of_traces",
]


# --- Chains of join points -------------------------------------------------------

_switched_off = 0  # hooks_off() blocks open: the chains built meanwhile run no callback


@contextlib.contextmanager
def hooks_off() -> Iterator[None]:
    """Inside the block, every join point runs as its plain function and every
    ``emit`` reaches no callback, in every thread of the process, whatever was
    registered before or during it (an evaluation, a benchmark, a warm-up you do
    not want counted). Blocks nest; leaving the outermost turns the callbacks back
    on for the next call. No call pays for it outside a block: switching drops the
    chains built, and the ones built while it is open are empty."""
    global _switched_off
    with lock:
        _switched_off += 1
        if _switched_off == 1:
            GLOBAL.changed(None)  # every chain and listener list, dropped: built again empty
    try:
        yield
    finally:
        with lock:
            _switched_off -= 1
            if not _switched_off:
                GLOBAL.changed(None)


def _build(jp: Any, tp: Any, state: Any, base: Any) -> Any:
    if _switched_off:
        note_planned(jp)
        return Chain(tp, True, (), (), (), (), False, base)
    spec = spec_of(jp)
    steps: dict[int, list[Any]] = {PRE: [], POST: [], AROUND: [], ERROR: []}
    check_state = False
    if state is None and jp.binding == METHOD and isinstance(tp, type):
        record = class_record(tp)
        check_state = record is not None and record.stateful
    for entry in entries_for(normalize(jp.event), False, tp, jp, state):
        if entry.source is GLOBAL_TIER:  # runs where it fits (see fitting_step)
            step = fitting_step(entry.registration, spec)
            if step is None:
                continue
        else:
            step = planned_step(entry.registration, spec)
        steps[PHASE_CODES[entry.phase]].append(step)
    chain = Chain(tp, True, tuple(steps[PRE]), tuple(steps[POST]), tuple(steps[AROUND]),
                  tuple(steps[ERROR]), check_state, base)
    keep_planning_out_of_traces()
    note_planned(jp)
    return chain


class Planner:
    """What a JoinPoint asks for its chains (see the dispatch modules)."""

    @staticmethod
    def wrapped_runner(func: Any) -> Any:
        """What runs the chain of ``func`` when it is a coroutine or generator
        function: inside the coroutine or generator the call returns
        (_asyncgen). None for a plain function."""
        if inspect.iscoroutinefunction(func):
            return run_chain_async
        if inspect.isgeneratorfunction(func):
            return run_chain_generator
        if inspect.isasyncgenfunction(func):
            return run_chain_async_generator
        return None

    traced_dispatch = staticmethod(traced_dispatch)  # the pure twin's, for torch.compile
    untraced = False  # its entry points are kept out of torch.compile's traces

    @staticmethod
    def named(jp: Any, owner: type, name: str) -> None:
        """A join point named in a class: on an nn.Module, see ``_traced``."""
        keep_planning_out_of_traces()
        install(jp, owner, name)

    @staticmethod
    def type_chain(jp: Any, tp: Any) -> Any:
        """The chain of ``jp`` for instances of ``tp`` (no instance tier)."""
        with lock:
            if jp.binding == FUNCTION and jp.owner is None:
                record: Any = function_record(jp)
            else:
                if jp.owner is not None and isinstance(tp, type) and not issubclass(tp, jp.owner):
                    # A foreign self (H.m(other, ...)): the method runs as plain Python
                    # would run it, with no callbacks, and nothing is kept on `tp`.
                    note_planned(jp)
                    return Chain(tp, False, (), ())
                if class_record(tp, create=False) is None and not fires(jp, tp):
                    # A join point no longer in tp's attributes (removed, held by
                    # someone): it runs as the function, and nothing is kept on tp.
                    note_planned(jp)
                    return Chain(tp, False, (), ())
                record = class_record(tp)
                if not fires(jp, tp):
                    # A super() call, or a call that began before weave's remove()
                    # restored the method: nothing of this join point runs for tp.
                    chain = record.chains[jp] = Chain(tp, False, (), ())
                    note_planned(jp)
                    return chain
                if not record.checked:
                    check_class_tier(tp)
                    record.checked = True
            chain = record.chains.get(jp)
            if chain is not None and chain.valid and chain.tp is tp:
                return chain
            chain = _build(jp, tp, None, None)
            record.chains[jp] = chain
            return chain

    @staticmethod
    def instance_chain(state: Any, jp: Any, type_chain: Any) -> Any:
        """The chain of ``jp`` for one instance: class, instance, then global tier."""
        with lock:
            return _build(jp, type_chain.tp, state, type_chain)


PLANNER = Planner()


# Planners whose entry points (static methods) run on cache misses only.
_PLANNERS: list[tuple[type, tuple[str, ...]]] = []


def plans_out_of_traces(planner: type, *names: str) -> None:
    """Keep ``planner``'s static methods ``names`` out of torch.compile's traces
    (see ``keep_planning_out_of_traces``)."""
    _PLANNERS.append((planner, names))
    keep_planning_out_of_traces()


def keep_planning_out_of_traces() -> None:
    """Once torch is imported, wrap the planners' entry points in
    ``torch.compiler.disable``: under torch.compile, Dynamo would otherwise
    compile each Python frame of chain building (a lock, signatures, weak
    references) that a dispatch reaches, one graph break after another. Only
    a cache miss reaches a planner, so the wrapper costs a call nothing."""
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    if compiler is None:
        return
    for planner, names in _PLANNERS:
        if planner.__dict__.get("untraced"):
            continue
        for name in names:
            setattr(planner, name, staticmethod(compiler.disable(getattr(planner, name))))
        planner.untraced = True  # type: ignore[attr-defined]


plans_out_of_traces(Planner, "type_chain", "instance_chain")  # now if torch is imported


def _release_hot_caches(phase: str, info: dict[str, Any]) -> None:
    """gc callback: before a full collection, empty every join point's hot cache (it
    holds the class of its last call); the next call finds its chain again."""
    if phase == "start" and info.get("generation") == 2:
        # torch._guards may be mid-import (a collection can start there): no CompileContext yet, none at work
        context = getattr(sys.modules.get("torch._guards"), "CompileContext", None)
        if context is not None and context.try_get() is not None:
            # torch.compile is at work in this thread: the guards it is building read
            # the chains it traced (a chain's runners); emptied now, building them
            # fails (KeyError inside Dynamo). The next full collection frees them.
            return
        for jp in all_join_points():
            jp.forget_last_chain()


gc.callbacks.append(_release_hot_caches)


# --- Custom events: listeners and their plans ------------------------------------

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
                entries = entries_for(name, True, tp, None, state) if not _switched_off else []
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
