"""Building the chain a call runs, on a cache miss, in pure Python.

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
"""

from __future__ import annotations

import gc
import inspect
import sys
from typing import Any

from ._checks import PHASE_CODES, fitting_step, planned_step
from ._dispatch import Chain
from ._policy import AROUND, ERROR, FUNCTION, METHOD, POST, PRE
from ._joinpoints import all_join_points, fires, spec_of
from ._owners import class_record, function_record, lock
from ._tiers import GLOBAL_TIER, check_class_tier, entries_for
from ._traced import install, note_planned, traced_dispatch
from ._asyncgen import run_chain_async, run_chain_async_generator, run_chain_generator
from ._events import normalize

__all__ = ["PLANNER", "Planner", "keep_planning_out_of_traces", "plans_out_of_traces"]


def _build(jp: Any, tp: Any, state: Any, base: Any) -> Any:
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
        guards = sys.modules.get("torch._guards")
        if guards is not None and guards.CompileContext.try_get() is not None:
            # torch.compile is at work in this thread: the guards it is building read
            # the chains it traced (a chain's runners); emptied now, building them
            # fails (KeyError inside Dynamo). The next full collection frees them.
            return
        for jp in all_join_points():
            jp.forget_last_chain()


gc.callbacks.append(_release_hot_caches)
