"""Dispatch policy both twins share, written once: the constants a plan is made
of, the listener plan of a custom event, and the one rule "which callback runs"
that every interpreter of a chain follows.

Nothing here runs per call on the compiled path: ``_fast.pyx`` imports the
strings and bounds, and compiles the numbers in as C constants
(``_fast.pinned_constants()`` hands them back, and tests/test_implementation.py
pins them to these). It imports nothing of
hookwrap's, so every module can import it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

# How a join point receives the object callbacks see as their first argument.
FUNCTION = 0  # plain function or staticmethod: no object
METHOD = 1  # instance method: args[0] is the instance
CLASSMETHOD = 2  # args[0] is the class

# What an ArgRef reads from a call.
POS_ONLY = 0
POS_OR_KW = 1
KW_ONLY = 2
VAR_POS = 3
VAR_KW = 4
RETURN_VALUE = 5  # the result, given to post callbacks
EXCEPTION = 6  # the exception, given to error callbacks

# Phases of a Step.
PRE = 0
POST = 1
AROUND = 2
ERROR = 3

# How far a guarded join point's function got when a callback raised StopTraining
# (what ``Guard.stopped`` is told; see _guarded).
NOT_STARTED = 0
STARTED = 1  # interrupted midway
DONE = 2

MISSING = inspect.Parameter.empty
# A callback may ask for at most this many arguments of the join point (the
# compiled twin calls it from a fixed C array; both twins refuse more alike).
MAX_CALLBACK_ARGS = 31
# Plans (and the pure twin's runners) kept per chain for its call shapes (how many
# positional arguments, which keyword names), and per custom event for the sets of
# keywords emitted: the first this many. A call of another shape runs on the
# general path (compiled: no plan; pure: no generated runner, whose keyword
# names CPython 3.12+ would keep interned for good), keeping nothing, so a
# program passing ever new keyword names (a dict of metrics as **kwargs) keeps
# memory flat and stops paying for planning each new shape.
MAX_CALL_SHAPES = 64
STATE_KEY = "__hookwrap__"  # read as an attribute by the dispatch functions
# Where a class keeps its record (``_owners.ClassRecord``).
RECORD_ATTR = "__hookwrap_class__"
# The pure twin stores a join point's dispatch function, which carries it here.
JOIN_POINT_ATTR = "__hookwrap_join_point__"

# Where a join point's chains come from (``_chains.Planner``); handed to each
# JoinPoint when it is built, so the twins call no registry code by name.
#   planner.type_chain(jp, tp) -> Chain         the chain for instances of tp
#   planner.instance_chain(state, jp, type_chain) -> Chain
#   planner.wrapped_runner(func) -> what runs the chain of a coroutine or generator
#       function, run_wrapped(chain, func, obj, args, kwargs), or None


# A call shape's plan (_fast._plan_shape, _codegen.runner): where each argument a
# step names is found in a call with `nargs` positional arguments then the
# keywords `kwnames`: its place among them (0 ..), or one of these.
SLOT_DEFAULT = -1  # not passed: its default (post callbacks only)
SLOT_RESULT = -2  # the join point's result


def step_slots(step: Any, phase: int, nargs: int, kwnames: tuple[str, ...]) -> tuple[int, ...] | None:
    """The slots of ``step``'s arguments (see SLOT_DEFAULT) in a call of this shape,
    or None where the call needs the general path: a ``*args``/``**kwargs`` or
    ``exception`` argument, one not passed without a default, or one not passed
    that a pre callback would replace (which would need a new keyword)."""
    slots = []
    for ref in step.refs:
        if ref.kind == RETURN_VALUE:
            slots.append(SLOT_RESULT)
        elif ref.kind > KW_ONLY:
            return None
        elif ref.kind != KW_ONLY and ref.index < nargs:
            slots.append(ref.index)
        elif ref.kind != POS_ONLY and ref.name in kwnames:
            slots.append(nargs + kwnames.index(ref.name))
        elif phase == PRE or ref.default is MISSING:
            return None
        else:
            slots.append(SLOT_DEFAULT)
    return tuple(slots)


def first_admitted(steps: tuple[Any, ...], index: int, obj: Any) -> int:
    """The index of the first step from ``index`` on whose filter (every/once/when)
    admits this call, or ``len(steps)``. Asking a filter counts the call, so each
    is asked once per call, in order: around advice is skipped so (the
    interpreters of a chain call this; the compiled twin's inline loop and the
    generated runners are pinned to it by tests/test_differential.py)."""
    n = len(steps)
    while index < n:
        gate = steps[index].gate
        if gate is None or gate.admit(obj):
            return index
        index += 1
    return n


def run_steps(steps: tuple[Any, ...], obj: Any, args: list[Any], kwargs: dict[str, Any],
              result: Any) -> Any:
    """Run the steps of one phase in order, those their filter admits, each applying
    the return contract (``Step.absorb``) to what it returned; returns the result
    (``result`` as the post callbacks left it; pre and error steps leave it as is).
    The interpreter every general path shares: either twin's Steps run on it.

    A callback that raises ``StopTraining`` does not cost the phase's other
    callbacks their turn: they run, then the first stop is raised (what is logged
    or saved does not depend on the order callbacks were attached in). The fast
    paths (``_fast.pyx:_run_fast``, ``_codegen.runner``, the emit runners,
    ``_asyncrun``) mirror this."""
    for i, step in enumerate(steps):
        if step.gate is None or step.gate.admit(obj):
            try:
                raw = step.invoke(obj, args, kwargs, result)
            except Exception as exc:
                from .errors import StopTraining  # errors imports this module: here, on an error only

                if isinstance(exc, StopTraining):  # inside the handler: a later error chains to it
                    finish_phase(exc, steps[i + 1:], obj, args, kwargs, result)
                raise
            result = step.absorb(obj, args, kwargs, raw, result)
    return result


def finish_phase(stop: BaseException, steps: tuple[Any, ...], obj: Any, args: list[Any],
                 kwargs: dict[str, Any], result: Any) -> None:
    """A callback of a phase raised ``stop`` (a StopTraining): run the phase's
    remaining ``steps`` (``run_steps``: a later stop is dropped, another error goes
    on), then raise ``stop``. The fast paths call it on their error path only, so a
    call that raises nothing pays nothing for the rule."""
    from .errors import StopTraining  # errors imports this module: here, on an error only

    try:
        run_steps(steps, obj, args, kwargs, result)
    except StopTraining:
        pass  # the first stop is the one raised
    raise stop


class EmitStep(NamedTuple):
    """One listener of a custom event, planned for one call shape: ``take`` holds
    the places (among the keywords emitted) of the ones it is passed, named
    ``names``; None when it takes them all."""

    fn: Callable[..., Any]
    gate: Any
    take: tuple[int, ...] | None
    names: tuple[str, ...]
    label: str
