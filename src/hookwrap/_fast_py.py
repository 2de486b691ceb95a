"""Per-call dispatch in plain Python: the reference for what a call does, and
the twin of the compiled ``_fast.pyx``.

Both define the ten names of ``_dispatch.TWIN_NAMES`` with the same behaviour;
``_dispatch`` picks one. What a plan is made of is ``_policy``'s; the rules of a
call (the return contract, around advice, the emit loop) are ``_rules``', which
this twin runs as they are (``Step.absorb``, ``call_around``, ``emitter`` are
``_rules``' own). For speed, this twin runs most calls
on code ``_codegen`` generates from the same plans (tests/test_differential.py
pins that code to this one); it only follows plans built at registration
(``_signature.py``, ``_chains.py``): no ``inspect``, no sorting, no string
formatting unless an error is being raised. Keep it in step with
``_fast.pyx``: the test suite runs against both.
"""

from __future__ import annotations

import inspect
from types import MethodType
from typing import Any, Callable

from . import _codegen
from ._policy import (
    CLASSMETHOD,
    DONE,
    FUNCTION,
    JOIN_POINT_ATTR,
    KW_ONLY,
    MAX_CALL_SHAPES,
    METHOD,
    MISSING,
    NOT_STARTED,
    POS_ONLY,
    POS_OR_KW,
    PRE,
    RETURN_VALUE,
    STARTED,
    STATE_KEY,
    VAR_POS,
    EmitStep,
)
from ._rules import absorb, run_steps
from ._rules import call_around as call_around  # twin names the pure twin takes as written
from ._rules import emitter as emitter
from .errors import StopTraining as _StopTraining
from .errors import missing_argument as _missing_argument
from .errors import note_callback as _note_callback

_OBJECT_GETATTRIBUTE: Any = object.__getattribute__  # an instance's own attribute, whatever its class's


class ArgRef:
    """Where one named argument of a join point lives in a call, planned once."""

    __slots__ = ("kind", "index", "name", "default", "extra")

    def __init__(self, kind: int, index: int, name: str, default: Any, extra: Any) -> None:
        self.kind = kind
        self.index = index  # positional index (start of the extras for VAR_POS)
        self.name = name
        self.default = default
        # POS_ONLY: defaults of the positions before `index` (to fill a gap);
        # VAR_KW: names that are not extra keywords.
        self.extra = extra

    def read(self, args: Any, kwargs: dict[str, Any] | None) -> Any:
        kind = self.kind
        if kind == POS_OR_KW:
            if self.index < len(args):
                return args[self.index]
            return kwargs.get(self.name, self.default) if kwargs else self.default
        if kind == POS_ONLY:
            return args[self.index] if self.index < len(args) else self.default
        if kind == KW_ONLY:
            return kwargs.get(self.name, self.default) if kwargs else self.default
        if kind == VAR_POS:
            return tuple(args[self.index:])
        # VAR_KW
        if not kwargs:
            return {}
        return {k: v for k, v in kwargs.items() if k not in self.extra}

    def write(self, args: list[Any], kwargs: dict[str, Any], value: Any) -> None:
        kind = self.kind
        if kind == POS_OR_KW:
            if self.index < len(args):
                args[self.index] = value
            else:
                kwargs[self.name] = value
        elif kind == POS_ONLY:
            if self.index < len(args):
                args[self.index] = value
            else:  # positional-only and not passed: fill the gap with defaults
                args.extend(self.extra[len(args):])
                args.append(value)
        elif kind == KW_ONLY:
            kwargs[self.name] = value
        elif kind == VAR_POS:
            del args[self.index:]
            args.extend(value)
        else:  # VAR_KW
            for key in [k for k in kwargs if k not in self.extra]:
                del kwargs[key]
            kwargs.update(value)


class Step:
    """One callback planned against one join point: what to pass, what comes back."""

    __slots__ = ("fn", "event", "label", "phase", "pass_obj", "refs", "kwnames", "gate", "consumes")

    def __init__(self, fn: Callable[..., Any], event: str, label: str, phase: int,
                 pass_obj: bool, refs: tuple[ArgRef, ...], kwnames: tuple[str, ...],
                 gate: Any = None) -> None:
        self.fn = fn
        self.event = event
        self.label = label
        self.phase = phase
        self.pass_obj = pass_obj
        self.refs = refs
        self.kwnames = kwnames  # the last len(kwnames) refs are passed by keyword
        self.gate = gate  # a filter (every/once/when) with .admit(obj), or None
        if phase == PRE:
            self.consumes = len(refs)
        else:
            self.consumes = sum(1 for r in refs if r.kind == RETURN_VALUE)

    def invoke(self, obj: Any, args: Any, kwargs: dict[str, Any] | None, result: Any) -> Any:
        """Call the callback with the arguments it named; return what it returned."""
        values = [obj] if self.pass_obj else []
        for ref in self.refs:
            value = result if ref.kind >= RETURN_VALUE else ref.read(args, kwargs)
            if value is MISSING:
                raise _missing_argument(self, ref)
            values.append(value)
        try:
            if self.kwnames:
                n = len(self.kwnames)
                keywords = dict(zip(self.kwnames, values[-n:]))
                return self.fn(*values[:-n], **keywords)
            return self.fn(*values)
        except BaseException as exc:
            _note_callback(exc, self.label, self.event)
            raise

    absorb = absorb  # the return contract, as _rules writes it


class Chain:
    """The ordered callbacks of one event for one class (or instance).

    ``valid`` is cleared when a registration changes what it would hold: a call
    that finds it cleared asks its planner for a new one. ``base``: for an
    instance's chain, the class chain it extends (stale once that is replaced).
    """

    __slots__ = ("tp", "valid", "base", "fire", "pre", "post", "around", "error", "empty",
                 "check_state", "own_getattribute", "passthrough", "read_by_trace", "runners")

    def __init__(self, tp: Any, fire: bool, pre: tuple[Step, ...],
                 post: tuple[Step, ...], around: tuple[Step, ...] = (),
                 error: tuple[Step, ...] = (), check_state: bool = True,
                 base: Chain | None = None) -> None:
        self.tp = tp
        self.valid = True
        self.base = base
        self.fire = fire  # False when a subclass overrides this join point (super() call)
        self.pre = pre
        self.post = post
        self.around = around
        self.error = error
        self.empty = not (pre or post or around or error)
        # Could an instance of `tp` hold callbacks of its own? (its ClassRecord knows)
        self.check_state = check_state
        # Instances of a class of its own __getattribute__ (a proxy): their state is
        # read with object's, on the general path (_dispatch).
        self.own_getattribute = (check_state and isinstance(tp, type)
                                 and tp.__getattribute__ is not _OBJECT_GETATTRIBUTE)
        # The one check a call makes when nothing can run.
        self.passthrough = not fire or (self.empty and not check_state)
        self.read_by_trace = False  # the compiled twin's mark (its `traced` sets it)
        # Call shape (positional count, and the keyword names in order if any) ->
        # its generated runner (_codegen.runner), or False.
        self.runners: dict[Any, Any] = {}

    @property
    def traced(self) -> Chain:
        """What torch.compile traces for this chain (_traced): the chain itself, as
        its steps are Python already (the compiled twin's is a pure copy)."""
        return self


class HookState:
    """Per-instance hook state: the instance's own attribute ``STATE_KEY`` (see _instances)."""

    __slots__ = ("chains", "emit_cache")

    def __init__(self) -> None:
        self.chains: dict[Any, Chain] = {}
        self.emit_cache: dict[str, EmitEvent] = {}  # custom event -> its listeners (see emit)

    def chain_for(self, jp: JoinPoint, type_chain: Chain) -> Chain:
        chain = self.chains.get(jp)
        if chain is None or not chain.valid or chain.base is not type_chain:
            chain = jp.planner.instance_chain(self, jp, type_chain)
            self.chains[jp] = chain
        return chain

    def forget_last_chain(self) -> None:
        """Nothing to drop: only the compiled twin keeps a last chain per instance."""


_NO_CHAIN = Chain(MISSING, False, (), ())
_NO_CHAIN.valid = False


class JoinPoint:
    """A hookable function or method: its state, and the function that dispatches it.

    In this pure twin, what a class (or module) holds is ``as_attribute(jp)``: a
    plain function, because a function binds to an instance at C speed where a
    Python-level ``__get__`` cannot. It shares its ``__dict__`` with the join point.
    """

    __slots__ = ("func", "event", "explicit_event", "binding", "owner", "attr_name",
                 "is_async", "run_wrapped", "guard", "planner", "spec", "record", "_chain", "_dispatch", "_codes",
                 "__dict__", "__weakref__")

    def __init__(self, func: Callable[..., Any], event: str | None, binding: int,
                 planner: Any) -> None:
        self.func = func
        # Event name: the explicit one, else the attribute name in the class
        # (__set_name__), else the function's __name__.
        self.explicit_event = event is not None
        self.event = event if event is not None else getattr(func, "__name__", "?")
        self.binding = binding
        self.owner: type | None = None
        self.attr_name: str | None = None
        self.is_async = inspect.iscoroutinefunction(func)
        self.run_wrapped = planner.wrapped_runner(func)  # a coroutine or generator's, else None
        self.guard: Any = None  # _guarded.Guard: what runs around its callbacks, when they run
        self.planner = planner
        self.spec: Any = None  # its parameters, read once (signature.JoinPointSpec)
        self.record: Any = None  # registrations on this function itself (_owners.Record)
        self._chain = _NO_CHAIN  # the chain of the last class it ran for
        self._dispatch, self._codes = _make_dispatch(self)
        self._dispatch.__dict__ = self.__dict__
        self.__dict__[JOIN_POINT_ATTR] = self  # how _dispatch.join_point_of finds it

    def forget_last_chain(self) -> None:
        """Drop the one-entry cache (it holds its class strongly; see _chains)."""
        self._chain = _NO_CHAIN

    def listened(self, obj: Any) -> bool:
        """Would a call of this method on ``obj`` run callbacks? (The chain its
        dispatch would run; what a caller routing to it skips where none would.)"""
        chain = _chain_of(self, obj, type(obj))
        return not (chain.passthrough or chain.empty)

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner = owner
        self.attr_name = name
        if not self.explicit_event:
            self.event = name
        if self.binding == FUNCTION:  # defined in a class body: an instance method
            self.rebind(METHOD)
        self.planner.named(self, owner, name)  # as the compiled twin's __set_name__ does

    def rebind(self, binding: int) -> None:
        """Make it a join point of another kind (a function found in a class body
        is a method): its dispatch function takes that kind's code."""
        self.binding = binding
        self._dispatch.__code__ = self._codes[binding]

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        if obj is None:
            return self
        if self.is_async and _ASYNC_STORED_AS_ITSELF:  # bound, it still reads as async
            return MethodType(self, obj)
        return MethodType(self._dispatch, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._dispatch(*args, **kwargs)

    def __reduce__(self) -> str:
        # Pickle by reference, like the function it wraps.
        return str(getattr(self, "__qualname__"))

    def __repr__(self) -> str:
        # As the dispatch function stored for it reads, and the compiled twin's.
        return f"<function {getattr(self, '__qualname__', self.event)} at {id(self):#x}>"


def show_python_twins(get: Any, call: Any, pure_copy: Any, emit_get: Any, emit_call: Any) -> None:
    """Nothing to do here: this twin's join points are Python already (see _traced)."""


# Python 3.11 has no inspect.markcoroutinefunction: its iscoroutinefunction reads
# the code flags of a function or of a function-like object, never a mark. There
# an async join point is stored as itself, made function-like (hookable gives it
# the function's __code__), and binds to itself: a Python-level __get__ and
# __call__ cost it ~0.3 us a call (making and closing its coroutine: 261 -> 562 ns).
_ASYNC_STORED_AS_ITSELF = not hasattr(inspect, "markcoroutinefunction")


def as_attribute(jp: JoinPoint) -> Any:
    """What to store in a class or module for ``jp``: its dispatch function (but see
    _ASYNC_STORED_AS_ITSELF)."""
    stored = _named_like(jp._dispatch, jp.func)
    return jp if jp.is_async and _ASYNC_STORED_AS_ITSELF else stored


def _named_like(stored: Any, func: Any) -> Any:
    """Give ``stored`` (a function standing for ``func`` in a class) ``func``'s names,
    so that it reads, and pickles by reference, as ``func``."""
    for name in ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__"):
        value = getattr(func, name, None)
        if value is not None:
            setattr(stored, name, value)
    return stored


def _make_dispatch(jp: JoinPoint) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The dispatch function of ``jp``, and its code for each binding (``rebind``)."""
    variants = _codegen.dispatcher(_codegen.slot_count(jp.func))(jp, jp.func, _dispatch)
    dispatch = variants[jp.binding]

    def traced(*args: Any, **kwargs: Any) -> Any:
        return jp.planner.traced_dispatch(jp, args, kwargs)

    # What torch.compile's Dynamo inlines in place of `dispatch` (it unwraps
    # `_torchdynamo_inline` from every function it inlines): a dispatch that
    # reads no hot cache, which changes under it (see _traced).
    dispatch._torchdynamo_inline = traced
    return dispatch, tuple(variant.__code__ for variant in variants)


def _dispatch(jp: JoinPoint, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    binding = jp.binding
    if binding == FUNCTION:
        obj = None
        tp = jp.owner
    elif args:
        obj = args[0]
        tp = obj if binding == CLASSMETHOD else type(obj)
    else:  # called unbound without an object: let Python report it
        return jp.func(*args, **kwargs)
    chain = jp._chain
    if chain.tp is not tp or not chain.valid:
        chain = jp.planner.type_chain(jp, tp)
        if not chain.own_getattribute:  # see _chain_of
            jp._chain = chain
    if chain.passthrough:
        return jp.func(*args, **kwargs)
    if chain.check_state:  # _chain_of's, inline: this is every call's path
        state = (getattr(obj, STATE_KEY, None) if not chain.own_getattribute
                 else _OBJECT_GETATTRIBUTE(obj, STATE_KEY))
        if state is not None:
            cached = state.chains.get(jp)
            if cached is not None and cached.valid and cached.base is chain:
                chain = cached
            else:
                chain = state.chain_for(jp, chain)
    if chain.empty:
        return jp.func(*args, **kwargs)
    if jp.guard is not None:
        return _run_guarded(jp.guard, chain, jp.func, obj, args, kwargs)
    if jp.run_wrapped is not None:  # a coroutine or generator: the chain runs inside it
        return jp.run_wrapped(chain, jp.func, obj, list(args), kwargs)
    if not kwargs:
        runner = chain.runners.get(len(args))
        if runner is None and len(chain.runners) < MAX_CALL_SHAPES:
            runner = chain.runners[len(args)] = _codegen.runner(chain, len(args), (), call_around)
        if runner:
            return runner(jp.func, obj, *args)
    else:
        shape = (len(args), tuple(kwargs))
        runner = chain.runners.get(shape)
        if runner is None and len(chain.runners) < MAX_CALL_SHAPES:
            runner = chain.runners[shape] = _codegen.runner(chain, len(args), shape[1], call_around)
        if runner:
            return runner(jp.func, obj, *args, *kwargs.values())
    return _run_owned(chain, jp.func, obj, list(args), kwargs)


def _chain_of(jp: JoinPoint, obj: Any, tp: Any) -> Chain:
    """The chain a call of ``jp`` on ``obj`` (of class ``tp``) runs (``_dispatch``
    has it inline: a call there pays no extra frame)."""
    chain = jp._chain
    if chain.tp is not tp or not chain.valid:
        chain = jp.planner.type_chain(jp, tp)
        # The dispatch functions read an instance's state as `obj.__hookwrap__`,
        # which a class of its own __getattribute__ (a proxy) may answer for
        # another object: its calls keep to this path.
        if not chain.own_getattribute:
            jp._chain = chain
    if chain.passthrough or not chain.check_state:
        return chain
    # The instance's own attribute, as the compiled twin reads it. Its class
    # holds STATE_KEY = None (see _owners.class_record), so a miss never
    # reaches a __getattr__ (nn.Module's, or one delegating elsewhere).
    state = (getattr(obj, STATE_KEY, None) if not chain.own_getattribute
             else _OBJECT_GETATTRIBUTE(obj, STATE_KEY))
    if state is None:
        return chain
    cached = state.chains.get(jp)  # chain_for's hit, inline
    if cached is not None and cached.valid and cached.base is chain:
        return cached  # type: ignore[no-any-return]
    return state.chain_for(jp, chain)  # type: ignore[no-any-return]


def _run_guarded(guard: Any, chain: Chain, func: Callable[..., Any], obj: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], traced: bool = False) -> Any:
    """The chain of a guarded join point (``_guarded.Guard``) around a recorder of
    its function: a StopTraining goes to ``guard.stopped`` with how far the function
    got (NOT_STARTED, STARTED, DONE), what it returned and the call's own arguments;
    ``guard.changed`` hears of a result the callbacks replaced. ``admit``: whether
    the callbacks run at all. (Mirrored in C by _fast._run_guarded.)"""
    if guard.admit is not None and not guard.admit(obj):
        return func(*args, **kwargs)
    given_kwargs = dict(kwargs)  # the callbacks may rewrite the one they get
    state: list[Any] = [NOT_STARTED, None]

    def recorder(*args: Any, **kwargs: Any) -> Any:
        state[0] = STARTED
        result = func(*args, **kwargs)
        state[0], state[1] = DONE, result
        return result

    try:
        # The chain's generated runner for this call shape, as _dispatch picks it (not
        # where torch.compile traces: _traced reads no hot cache), else the general path.
        # Kept under a key of its own: the dispatch functions call a chain's runner
        # found under the call's own shape directly, which would skip the guard.
        shape = ("guarded", len(args), tuple(kwargs))
        runner = None if traced else chain.runners.get(shape)
        if runner is None and not traced and len(chain.runners) < MAX_CALL_SHAPES:
            runner = chain.runners[shape] = _codegen.runner(chain, len(args), tuple(kwargs), call_around)
        if runner:
            result = runner(recorder, obj, *args, *kwargs.values())
        else:
            result = _run_owned(chain, recorder, obj, list(args), kwargs)
    except _StopTraining as exc:
        return guard.stopped(obj, exc, state[0], state[1], tuple(args), given_kwargs)
    if guard.changed is not None and state[0] == DONE and result is not state[1]:
        guard.changed(obj, state[1], result)
    return result


def _run_owned(chain: Chain, func: Callable[..., Any], obj: Any, args: list[Any],
               kwargs: dict[str, Any]) -> Any:
    if not chain.error:
        return _run_main(chain, func, obj, args, kwargs)
    try:
        return _run_main(chain, func, obj, args, kwargs)
    except Exception as exc:
        _run_error_steps(chain, obj, args, kwargs, exc)
        raise


def _run_main(chain: Chain, func: Callable[..., Any], obj: Any, args: list[Any],
              kwargs: dict[str, Any]) -> Any:
    run_steps(chain.pre, obj, args, kwargs, None)
    if chain.around:
        # Around advice sees the call's own arguments, without the object.
        result = call_around(chain.around, 0, func, obj,
                             tuple(args[1:] if chain.around[0].pass_obj else args), kwargs)
    else:
        result = func(*args, **kwargs)
    return run_steps(chain.post, obj, args, kwargs, result)


def _run_error_steps(chain: Chain, obj: Any, args: list[Any], kwargs: dict[str, Any],
                    exc: BaseException) -> None:
    if isinstance(exc, _StopTraining):  # control flow, not a failure
        return
    run_steps(chain.error, obj, args, kwargs, exc)


# --- Custom events: obj.emit(name, **kw) and hookwrap.emit(obj, name, **kw) ----

class EmitEvent:
    """One custom event's listeners on one owner, and its plan per call shape
    (the keyword names emitted, in order). The emit function below also runs
    over the compiled twin's (torch.compile traces it in place of that one's)."""

    __slots__ = ("listeners", "plans", "runners")

    def __init__(self, listeners: tuple[Any, ...]) -> None:
        self.listeners = listeners
        self.plans: dict[tuple[str, ...], tuple[EmitStep, ...]] = {}
        self.runners: dict[tuple[str, ...], Callable[..., None]] = {}  # the pure emit's
