"""A call's plan and its rules, each written once, as readable Python: the reference.

What a plan is made of, shared by both twins: its constants, where a call
shape's arguments are (``step_slots``), and the listener plan of a custom event
(``EmitStep``); a join point's ``Guard``. Nothing of these runs per call on the
compiled path: ``_fast.pyx`` imports the strings and bounds, and compiles the
numbers in as C constants (``_fast.pinned_constants()`` hands them back, and
tests/core/test_implementation.py pins them to these).

The rules a call follows:

* which callback runs: ``first_admitted``; a phase's callbacks in order, a
  StopTraining raised after the others had their turn: ``run_steps``,
  ``finish_phase``;
* the return contract (a callback returns what it takes): ``absorb``;
* around advice (``proceed`` at most once, only during the advice's call; an
  error passed through it is not the advice's own): ``Proceed``, ``call_around``;
* a custom event's listeners: ``run_emit_steps``, ``finish_emit``, ``emitter``.

The pure twin runs these as they are (``_fast_py.Step.absorb`` is ``absorb``).
Three kinds of code mirror them for speed, each marked so where it does:
``_fast.pyx`` (``Step.absorb``, ``_run_fast``'s inline loop, ``_Proceed`` and
``_around_from``, the emit plan's loop), the code ``_fast_py`` generates, and
``_asyncgen``, which adapts ``Proceed`` and ``absorb`` to ``await``.
tests/core/test_differential.py holds them equal: the compiled twin against the pure
one, and the generated code against these functions (random registrations,
calls and emits, results and errors compared).

It imports only ``errors``, so every module can import it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

from .errors import CallbackReturnError, HookError, StopTraining, note_callback, safe_repr

__all__ = [
    "PROCEED_CALLED",
    "PROCEED_ENDED",
    "PROCEED_FRESH",
    "Proceed",
    "absorb",
    "call_around",
    "check_var_value",
    "emit_return_error",
    "emitter",
    "finish_emit",
    "finish_phase",
    "first_admitted",
    "missing_argument",
    "proceed_not_awaited",
    "proceed_twice",
    "return_error",
    "run_emit_steps",
    "run_steps",
]


# --- The plan --------------------------------------------------------------------

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


# --- The rules of a call ---------------------------------------------------------

_OBJECT_GETATTRIBUTE: Any = object.__getattribute__  # an instance's own attribute, whatever its class's


def first_admitted(steps: tuple[Any, ...], index: int, obj: Any) -> int:
    """The index of the first step from ``index`` on whose filter (every/once/when)
    admits this call, or ``len(steps)``. Asking a filter counts the call, so each
    is asked once per call, in order: around advice is skipped so."""
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
    the return contract (``absorb``) to what it returned; returns the result
    (``result`` as the post callbacks left it; pre and error steps leave it as is).
    Either twin's Steps run on it.

    A callback that raises ``StopTraining`` does not cost the phase's other
    callbacks their turn: they run, then the first stop is raised (what is logged
    or saved does not depend on the order callbacks were attached in)."""
    for i, step in enumerate(steps):
        if step.gate is None or step.gate.admit(obj):
            try:
                raw = step.invoke(obj, args, kwargs, result)
            except StopTraining as exc:  # inside the handler: a later error chains to it
                finish_phase(exc, steps[i + 1:], obj, args, kwargs, result)
            result = step.absorb(obj, args, kwargs, raw, result)
    return result


def finish_phase(stop: BaseException, steps: tuple[Any, ...], obj: Any, args: list[Any],
                 kwargs: dict[str, Any], result: Any) -> None:
    """A callback of a phase raised ``stop`` (a StopTraining): run the phase's
    remaining ``steps`` (``run_steps``: a later stop is dropped, another error goes
    on), then raise ``stop``. The fast paths call it on their error path only, so a
    call that raises nothing pays nothing for the rule."""
    try:
        run_steps(steps, obj, args, kwargs, result)
    except StopTraining:
        pass  # the first stop is the one raised
    raise stop


def absorb(step: Any, obj: Any, args: list[Any], kwargs: dict[str, Any], raw: Any, result: Any) -> Any:
    """The return contract: apply ``raw``, what callback ``step`` returned, to the
    call; returns the call's result.

    * an error callback, or one that takes nothing, returns None;
    * a post callback that takes ``return_value`` returns the result (or its
      replacement; None only where the result was None);
    * a pre callback returns the argument it takes, or a tuple of the ones it
      takes, in order (each a replacement, None only where the value was None);
      what it returns is written back into the call.
    """
    if step.phase == ERROR:
        if raw is not None:
            raise return_error(step, raw, ())
        return result
    if step.phase == POST:
        if step.consumes:
            if raw is None and result is not None:
                raise return_error(step, raw, ("return_value",))
            return raw
        if raw is not None:
            raise return_error(step, raw, ())
        return result
    n = step.consumes
    if n == 0:
        if raw is not None:
            raise return_error(step, raw, ())
    elif n == 1:
        ref = step.refs[0]
        if raw is None and ref.read(args, kwargs) is not None:
            raise return_error(step, raw, (ref.name,))
        check_var_value(step, ref, raw)
        ref.write(args, kwargs, raw)
    else:
        if type(raw) is not tuple or len(raw) != n:
            raise return_error(step, raw, tuple(r.name for r in step.refs))
        for ref, value in zip(step.refs, raw):
            if value is None and ref.read(args, kwargs) is not None:
                raise return_error(step, raw, tuple(r.name for r in step.refs))
            check_var_value(step, ref, value)
        for ref, value in zip(step.refs, raw):
            ref.write(args, kwargs, value)
    return result


# What a proceed() knows of its own use (the dispatch modules keep it per proceed).
PROCEED_FRESH, PROCEED_CALLED, PROCEED_ENDED = 0, 1, 2


class Proceed:
    """The ``proceed`` one around advice is given: the around-advice protocol.

    Calling it runs ``rest(args, kwargs)`` (the inner advice, then the function)
    at most once, and only while the advice's own call lasts (``ended``); what
    the rest raises passes through the advice without being noted as the
    advice's own error (``failed``)."""

    __slots__ = ("step", "rest", "state", "raised")

    def __init__(self, step: Any, rest: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> None:
        self.step = step
        self.rest = rest
        self.state = PROCEED_FRESH  # then PROCEED_CALLED, or PROCEED_ENDED once the advice returned
        self.raised: BaseException | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.state:
            raise proceed_twice(self.step, self.state)
        self.state = PROCEED_CALLED
        try:
            return self.rest(args, kwargs)
        except BaseException as exc:
            self.raised = exc  # passed through: not the around callback's own error
            raise

    def failed(self, exc: BaseException) -> None:
        """The advice raised ``exc``: note it as the callback's own unless it came
        through ``proceed``."""
        if exc is not self.raised:
            note_callback(exc, self.step.label, self.step.event)

    def ended(self) -> None:
        """The advice's call is over: a proceed it kept refuses to run."""
        if not self.state:
            self.state = PROCEED_ENDED


def call_around(around: tuple[Any, ...], index: int, func: Callable[..., Any], obj: Any,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call around advice ``index`` (skipping filtered ones) with a ``Proceed`` that
    runs the rest, or, past the last, the function."""
    pass_obj = around[0].pass_obj  # a method's advice: the function takes the object
    index = first_admitted(around, index, obj)
    if index == len(around):
        return func(obj, *args, **kwargs) if pass_obj else func(*args, **kwargs)
    step = around[index]
    proceed = Proceed(step, lambda args, kwargs: call_around(around, index + 1, func, obj, args, kwargs))
    try:
        if pass_obj:
            return step.fn(obj, proceed, *args, **kwargs)
        return step.fn(proceed, *args, **kwargs)
    except BaseException as exc:
        proceed.failed(exc)
        raise
    finally:
        proceed.ended()


# --- Custom events: obj.emit(name, **kw) and hookwrap.emit(obj, name, **kw) ----

def run_emit_steps(steps: tuple[Any, ...], target: Any, name: str, kwargs: dict[str, Any]) -> None:
    """Call each listener (``_rules.EmitStep``) of one call shape that its filter
    admits, with the keywords it takes; a listener returns None; a StopTraining
    is raised after the others had their turn (``finish_emit``)."""
    for i, (fn, gate, _take, names, label) in enumerate(steps):
        if gate is not None and not gate.admit(target):
            continue
        try:
            r = fn(target, **{key: kwargs[key] for key in names})
        except StopTraining as e:
            note_callback(e, label, name)
            finish_emit(e, steps[i + 1:], target, name, kwargs)
        except BaseException as e:
            note_callback(e, label, name)
            raise
        if r is not None:
            raise emit_return_error(label, name, r)


def finish_emit(stop: BaseException, steps: tuple[Any, ...], target: Any, name: str,
                kwargs: dict[str, Any]) -> None:
    """A listener raised ``stop``: the remaining listeners run, then it is raised
    (``finish_phase`` for custom events)."""
    try:
        run_emit_steps(steps, target, name, kwargs)
    except StopTraining:
        pass  # the first stop is the one raised
    raise stop


def emitter(planner: Any) -> Callable[..., None]:
    """The ``emit`` function. On a miss it asks ``planner.gather(target, tp, name)``
    for the event's listeners (which it caches on their owner, an ``EmitEvent``)
    and ``planner.plan(event, shape, tp, name)`` for a call shape's steps (which it
    keeps in ``event.plans``, and their runner in ``event.runners``, for the first
    MAX_CALL_SHAPES shapes). The pure twin's emit; the compiled one keeps it to
    report a malformed call as Python would, and torch.compile traces it."""

    def emit(target: Any, name: str, /, **kwargs: Any) -> None:
        """Call the callbacks of custom event ``name`` on ``target``, each with the
        keywords it names (and ``target`` as its first argument)."""
        tp = target if isinstance(target, type) else type(target)
        record = getattr(tp, RECORD_ATTR, None)
        if record is not None and record.cls is not tp:
            record = None  # a base class's
        state = None
        if record is not None and record.stateful and tp is not target:
            # Some instance holds listeners of its own. The attribute is found in
            # any case: the class holds None (see _owners.class_record).
            state = (target.__hookwrap__ if not record.own_getattribute
                     else _OBJECT_GETATTRIBUTE(target, STATE_KEY))  # its own, not a proxy's answer
        owner = state if state is not None else record
        try:  # (a subscript, not .get: no method call)
            event = owner.emit_cache[name] if owner is not None else None
        except (KeyError, TypeError):  # TypeError: an unhashable name, which gather refuses
            event = None
        if event is None:  # not gathered yet
            event = planner.gather(target, tp, name)
        if not event.listeners:  # nothing to plan or run for any call shape
            return
        shape = tuple(kwargs)
        try:
            run = event.runners[shape]
        except KeyError:  # plan the shape: its steps, and their runner
            plan = planner.plan(event, shape, tp, name)
            run = event.runners.get(shape)
            if run is None:  # past MAX_CALL_SHAPES: planned for this call only
                run_emit_steps(plan, target, name, kwargs)
                return
        run(target, name, kwargs)

    return emit


# --- The errors a broken rule raises -----------------------------------------
# Built only once a rule is broken, so formatting never costs anything on a call
# that goes well. `step` and `ref` are a dispatch Step / ArgRef (either twin).

def missing_argument(step: Any, ref: Any) -> TypeError:
    return TypeError(
        f"callback {step.label} asks for argument {ref.name!r} of event {step.event!r}, "
        f"but the call did not pass it and it has no default."
    )


def check_var_value(step: Any, ref: Any, value: Any) -> None:
    """A replacement for ``*args``/``**kwargs`` must keep its container type."""
    if ref.kind == VAR_POS and not isinstance(value, (tuple, list)):
        raise CallbackReturnError(
            f"callback {step.label} for event {step.event!r} returned a "
            f"{type(value).__name__} for *{ref.name}; return a tuple of positional arguments."
        )
    if ref.kind == VAR_KW:
        if not isinstance(value, dict):
            raise CallbackReturnError(
                f"callback {step.label} for event {step.event!r} returned a "
                f"{type(value).__name__} for **{ref.name}; return a dict of keyword arguments."
            )
        for key in value:
            if not isinstance(key, str):
                raise CallbackReturnError(
                    f"callback {step.label} for event {step.event!r} returned a dict for "
                    f"**{ref.name} with the key {safe_repr(key)}; keyword arguments are named by strings."
                )
            if key in ref.extra:  # a named parameter: it has its own argument
                raise CallbackReturnError(
                    f"callback {step.label} for event {step.event!r} returned a dict for "
                    f"**{ref.name} with the key {key!r}, a parameter of its own; ask for {key!r} "
                    f"and return its replacement instead."
                )


def return_error(step: Any, raw: Any, names: tuple[str, ...]) -> CallbackReturnError:
    got = "None" if raw is None else f"a {type(raw).__name__} ({_short_repr(raw)})"
    if step.phase == ERROR:
        return CallbackReturnError(
            f"error callback {step.label} for event {step.event!r} returned {got}, but error "
            f"callbacks observe: they return None and the exception propagates. To recover "
            f"from the error, use around advice (obj.around) instead."
        )
    read = [ref.name for ref in getattr(step, "refs", ()) if ref.name != "return_value"]
    if not names and step.phase == POST and read:
        want = (f"None: a post callback reads the arguments ({', '.join(map(repr, read))}) but "
                f"cannot replace them, the call is over")
        fix = "drop the return value, or take return_value to replace the result"
    elif not names:
        want = "None, since it takes no arguments and so consumes nothing"
        fix = "drop the return value, or take the argument you mean to replace"
    elif len(names) == 1:
        want = f"the value of {names[0]!r} (or a replacement)"
        fix = f"end the callback with `return {names[0]}`"
    else:
        want = f"a tuple of {len(names)} values ({', '.join(names)})"
        fix = f"end the callback with `return {', '.join(names)}`"
    return CallbackReturnError(
        f"callback {step.label} for event {step.event!r} returned {got}, "
        f"but it must return {want}: a callback returns what it takes. Fix: {fix}."
    )


def emit_return_error(label: str, name: str, result: Any) -> CallbackReturnError:
    return CallbackReturnError(
        f"callback {label} for custom event {name!r} returned {type(result).__name__}; "
        f"custom event callbacks observe and return None."
    )


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not hide the error being reported
        return f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def proceed_twice(step: Any, state: int = PROCEED_CALLED) -> HookError:
    """A proceed() called when it may not be: a second time (``PROCEED_CALLED``), or
    after the advised call it was made for has ended (``PROCEED_ENDED``)."""
    if state == PROCEED_ENDED:
        join_point = str(step.event).removeprefix("around-")
        return HookError(
            f"around callback {step.label} for event {step.event!r} kept its proceed() and it "
            f"was called after that call of join point {join_point!r} had ended: proceed is "
            f"only valid inside the advice's own call, before the advice returns. To run the "
            f"join point again, call it (its callbacks and advice run again)."
        )
    return HookError(
        f"around callback {step.label} for event {step.event!r} called proceed() a second "
        f"time; call it at most once (to retry, loop inside a single call of the join point)."
    )


def proceed_not_awaited(step: Any) -> HookError:
    return HookError(
        f"async around callback {step.label} for event {step.event!r} called proceed() "
        f"without awaiting it, so the join point did not run. Fix: `return await proceed(...)` "
        f"(proceed() of an async join point returns a coroutine)."
    )
