"""What a plan is made of, shared by both twins and written once: its constants,
where a call shape's arguments are (``step_slots``), and the listener plan of a
custom event; a join point's ``Guard``. The rules a call follows are ``_rules``'.

Nothing here runs per call on the compiled path: ``_fast.pyx`` imports the
strings and bounds, and compiles the numbers in as C constants
(``_fast.pinned_constants()`` hands them back, and tests/core/test_implementation.py
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
# (what ``Guard.stopped`` is told; see Guard below).
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


# A call shape's plan (_fast._plan_shape, _fast_py.runner): where each argument a
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


class EmitStep(NamedTuple):
    """One listener of a custom event, planned for one call shape: ``take`` holds
    the places (among the keywords emitted) of the ones it is passed, named
    ``names``; None when it takes them all."""

    fn: Callable[..., Any]
    gate: Any
    take: tuple[int, ...] | None
    names: tuple[str, ...]
    label: str


# --- A join point's guard (``hookwrap.extend.guard``) ---------------------------
# What runs around a join point's callbacks, when they run. The dispatch runs a
# chain only when callbacks are to run; with none it calls the function itself,
# at the cost of the dispatch alone. A preset uses that: what it adds around a
# framework's stage (catch ``StopTraining`` and stop the framework's way, refuse
# a change the framework would never see) is only needed when a callback runs,
# so it is the join point's ``guard``, which both twins read only on that path
# (``_fast._run_guarded`` and its mirror ``_fast_py._run_guarded``): the chain
# runs around a recorder of the function, in the twin's own runner, and the
# guard's functions are called only when their case comes.

class Guard:
    """``stopped(obj, exc, ran, result, args, kwargs)``: a callback of the call raised
    StopTraining ``exc``; ``ran`` says how far the function got (NOT_STARTED,
    STARTED: interrupted midway, DONE: ``result`` is what it returned), ``args`` and
    ``kwargs`` are the call's own (``args[0]`` the object). It returns what the
    call returns, or raises. ``admit(obj)`` (optional): False runs the function
    alone, without callbacks. ``changed(obj, original, result)`` (optional): the
    callbacks returned another value than the function did."""

    __slots__ = ("admit", "changed", "stopped")

    def __init__(self, stopped: Callable[..., Any], admit: Callable[[Any], bool] | None = None,
                 changed: Callable[[Any, Any, Any], None] | None = None) -> None:
        self.stopped, self.admit, self.changed = stopped, admit, changed
