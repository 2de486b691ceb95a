"""Per-call dispatch in plain Python, the twin of the compiled ``_fast.pyx``, and
the code it generates.

Both twins define the ten names of ``_dispatch.TWIN_NAMES`` with the same
behaviour; ``_dispatch`` picks one. What a plan is made of, and the rules of a
call (the return contract, around advice, the emit loop), are ``_rules``', which
this twin runs as they are (``Step.absorb``, ``call_around``,
``emitter`` are ``_rules``' own). It only follows plans built at registration
(``_joinpoints.py``, ``_chains.py``): no ``inspect``, no sorting, no string
formatting unless an error is being raised. Keep it in step with
``_fast.pyx``: the test suite runs against both.

Generated code: a per-call interpreter loop over plans costs ~20x a
hand-written loop in pure Python; code generated from the plan (as attrs and
dataclasses generate their methods) costs about what the hand loop does. So
this twin runs most calls on generated code: its dispatch functions, and a
straight-line runner per chain and call shape (``runner``); and a custom
event's listeners run on an ``emit_runner`` in both twins (the compiled twin's
emit runs on it under torch.compile). Each is the mirror of ``_rules``, written
out for one plan (marked so where it is), and tests/core/test_differential.py holds
them equal. Every generated source is registered with ``linecache`` under a
name that says what it runs, so a traceback or pdb through it shows its lines.
Code is generated when a chain first sees a call shape (at most
MAX_CALL_SHAPES per chain), or an event a set of keywords, never per call.
"""

from __future__ import annotations

import hashlib
import inspect
import linecache
import threading
from keyword import iskeyword as _iskeyword
from types import FunctionType, MethodType
from typing import Any, Callable, cast

from ._rules import (
    CLASSMETHOD,
    DONE,
    FUNCTION,
    JOIN_POINT_ATTR,
    KW_ONLY,
    MAX_CALL_SHAPES,
    METHOD,
    MISSING,
    NOT_STARTED,
    POST,
    POS_ONLY,
    POS_OR_KW,
    PRE,
    RETURN_VALUE,
    SLOT_DEFAULT,
    SLOT_RESULT,
    STARTED,
    STATE_KEY,
    VAR_POS,
    EmitStep,
    absorb,
    call_around as call_around,  # twin names (_dispatch.TWIN_NAMES) this twin takes as written
    emit_return_error as _emit_return_error,
    emitter as emitter,
    finish_emit,
    finish_phase,
    missing_argument as _missing_argument,
    proceed_twice as _proceed_twice,
    return_error as _return_error,
    run_steps,
    step_slots,
)
from .errors import StopTraining
from .errors import note_callback as _note_callback

# --- The pure twin ---------------------------------------------------------------

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
        # its generated runner (generated_runner), or False.
        self.runners: dict[Any, Any] = {}

    @property
    def traced(self) -> Chain:
        """What torch.compile traces for this chain (_traced): the chain itself, as
        its steps are Python already (the compiled twin's is a pure copy)."""
        return self


class HookState:
    """Per-instance hook state: the instance's own attribute ``STATE_KEY`` (see _registry)."""

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
        self.guard: Any = None  # _rules.Guard: what runs around its callbacks, when they run
        self.planner = planner
        self.spec: Any = None  # its parameters, read once (signature.JoinPointSpec)
        self.record: Any = None  # registrations on this function itself (_owners.Record)
        self._chain = _NO_CHAIN  # the chain of the last class it ran for
        self._dispatch, self._codes = _make_dispatch(self)
        self._dispatch.__dict__ = self.__dict__
        self.__dict__[JOIN_POINT_ATTR] = self  # how _joinpoints.join_point_of finds it

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
    variants = dispatcher(slot_count(jp.func))(jp, jp.func, _dispatch)
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
            runner = chain.runners[len(args)] = generated_runner(chain, len(args), (), call_around)
        if runner:
            return runner(jp.func, obj, *args)
    else:
        shape = (len(args), tuple(kwargs))
        runner = chain.runners.get(shape)
        if runner is None and len(chain.runners) < MAX_CALL_SHAPES:
            runner = chain.runners[shape] = generated_runner(chain, len(args), shape[1], call_around)
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
    return _own_chain(jp, obj, chain, chain.own_getattribute)


def _own_chain(jp: JoinPoint, obj: Any, chain: Chain, own_getattribute: bool) -> Chain:
    """The chain a call on ``obj`` runs where its class's ``chain`` may meet the
    instance's own callbacks: its record's (built on a miss), else ``chain``
    (``_dispatch`` has it inline; ``_traced`` calls it as Dynamo reads it).

    The instance's own attribute is read as the compiled twin reads it. Its class
    holds STATE_KEY = None (see _owners.class_record), so a miss never reaches a
    __getattr__ (nn.Module's, or one delegating elsewhere)."""
    state = (getattr(obj, STATE_KEY, None) if not own_getattribute
             else _OBJECT_GETATTRIBUTE(obj, STATE_KEY))
    if state is None:
        return chain
    cached = state.chains.get(jp)  # chain_for's hit, inline
    if cached is not None and cached.valid and cached.base is chain:
        return cached  # type: ignore[no-any-return]
    return state.chain_for(jp, chain)  # type: ignore[no-any-return]


def _run_guarded(guard: Any, chain: Chain, func: Callable[..., Any], obj: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], traced: bool = False) -> Any:
    """The chain of a guarded join point (``_rules.Guard``) around a recorder of
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
            runner = chain.runners[shape] = generated_runner(chain, len(args), tuple(kwargs), call_around)
        if runner:
            result = runner(recorder, obj, *args, *kwargs.values())
        else:
            result = _run_owned(chain, recorder, obj, list(args), kwargs)
    except StopTraining as exc:
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
    if isinstance(exc, StopTraining):  # control flow, not a failure
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


# --- Generated code --------------------------------------------------------------

# Generated sources registered with linecache, by file name. The name holds a
# digest of the source, so planning the same chain again (callbacks added and
# removed each epoch) finds its name registered; past _SOURCES_KEPT, new code
# runs unregistered (a traceback shows no lines for it), so memory stays bounded.
# Nothing is ever removed: another thread formatting a traceback reads
# linecache's dict without a lock (3.11: `name in cache`, then `cache[name]`).
_SOURCES_KEPT = 1024
_sources: set[str] = set()
_sources_lock = threading.Lock()


def _define(source: str, what: str, ns: dict[str, Any], name: str) -> Any:
    """Run the generated ``source`` in ``ns`` and return its ``name``; its lines
    are registered with linecache as ``<hookwrap WHAT #digest>`` (the digest keeps
    two different sources of one description apart)."""
    what = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in what)  # a file name: no NUL, newline
    what = what if len(what) <= 200 else what[:197] + "..."
    digest = hashlib.blake2s(source.encode(), digest_size=4).hexdigest()
    filename = f"<hookwrap {what} #{digest}>"
    exec(compile(source, filename, "exec"), ns)  # noqa: S102 - generated from plans
    if filename not in linecache.cache:  # (new, or linecache.clearcache() ran)
        with _sources_lock:
            if filename in _sources or len(_sources) < _SOURCES_KEPT:
                _sources.add(filename)
                linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return ns[name]


# A dispatch function takes a call's first positional arguments (its "slots") as
# positional-only parameters defaulting to NOT_PASSED, then *args and **kwargs.
# It accepts every call the function would and knows exactly what was passed and
# how (around advice and errors see the call as it was made), and the usual call
# (the function's required arguments, by position) reaches the function without
# packing them into a tuple and a dict: a `*args, **kwargs` wrapper alone costs
# ~3.8x a bare call.
NOT_PASSED: Any = type("NotPassed", (), {"__repr__": lambda self: "<not passed>"})()
# A function with more required positional arguments takes the general path.
_MAX_SLOTS = 8


def slot_count(func: Any) -> int:
    """How many positional arguments every call of ``func`` passes (its required
    positional parameters), up to _MAX_SLOTS; 0 for what is not a plain function."""
    if not isinstance(func, FunctionType):
        return 0
    return min(func.__code__.co_argcount - len(func.__defaults__ or ()), _MAX_SLOTS)


# Per binding (FUNCTION, METHOD, CLASSMETHOD): what makes a call's chain the one
# cached, read from the call's first argument (FIRST), or the join point's owner.
_CACHED = {FUNCTION: "chain.tp is jp.owner", METHOD: "chain.tp is type(FIRST)",
           CLASSMETHOD: "chain.tp is FIRST"}
_dispatchers: dict[int, Callable[..., Any]] = {}


def dispatcher(n: int) -> Callable[..., Any]:
    """``make(jp, func, owned)``: ``n``-slot dispatch functions, one per binding,
    in binding order. They share their free variables, so that one's
    ``__code__`` can replace another's."""
    made = _dispatchers.get(n)
    if made is not None:
        return made
    slots = [f"a{i}" for i in range(n)]
    passed = ", ".join(slots)
    packed_slots = "".join(f"{slot}, " for slot in slots)
    params = "".join(f"{slot}=NOT_PASSED, " for slot in slots) + ("/, " if slots else "")
    packed = _packed(slots)
    source = ["def make(jp, func, owned):"]
    for binding in (FUNCTION, METHOD, CLASSMETHOD):
        # A call passing keywords, or other positional arguments than the slots:
        # the function if nothing can run (as below), else the general path.
        cached = _CACHED[binding].replace("FIRST", "args[0]")
        if binding != FUNCTION:
            cached = f"args and {cached}"
        if binding == METHOD:
            cached += (" and chain.valid and (chain.passthrough or chain.empty"
                       f" and args[0].{STATE_KEY} is None)")
        else:
            cached += " and chain.valid and chain.passthrough"
        source += [
            f"  def dispatch({params}*args, **kwargs):",
            f"    if args or kwargs{f' or {slots[-1]} is NOT_PASSED' if slots else ''}:",
        ] + ([f"        args = {packed}"] if slots else []) + [
            "        chain = jp._chain",
            f"        if {cached}:",
            "            return func(*args, **kwargs)",
            "        return owned(jp, args, kwargs)",
        ]
        if slots or binding == FUNCTION:
            obj = "None" if binding == FUNCTION else "a0"
            source += [
                "    chain = jp._chain",
                f"    if {_CACHED[binding].replace('FIRST', 'a0')} and chain.valid:",  # this call's class's
                "        if chain.passthrough:",
                f"            return func({passed})",
            ]
            if binding != FUNCTION:  # an instance may hold callbacks of its own
                source += [
                    "        if chain.check_state:",
                    f"            state = a0.{STATE_KEY}",  # its class holds None (class_record)
                    "            if state is not None:",  # HookState.chain_for, its hit inline
                    "                try:",  # (a subscript, not .get: no method call)
                    "                    own = state.chains[jp]",
                    "                except KeyError:",
                    "                    own = None",
                    "                if own is None or not own.valid or own.base is not chain:",
                    "                    own = state.chain_for(jp, chain)",
                    "                chain = own",
                ]
            source += [
                "        if chain.empty:",  # a sibling holds callbacks, this one none
                f"            return func({passed})",
                f"        run = chain.runners.get({n})",  # None until _dispatch compiles it
                "        if run:",
                f"            return run(func, {obj}{''.join(', ' + slot for slot in slots)})",
            ]
        source += [
            f"    return owned(jp, ({packed_slots}), kwargs)",
            "    func, owned  # (never run) every variant closes over these",
        ]
        source.append(f"  v{binding} = dispatch")
    source.append(f"  return v{FUNCTION}, v{METHOD}, v{CLASSMETHOD}")
    ns: dict[str, Any] = {"NOT_PASSED": NOT_PASSED, "STATE_KEY": STATE_KEY}
    made = _dispatchers[n] = cast(Callable[..., Any], _define("\n".join(source) + "\n", f"dispatch, {n} slots", ns, "make"))
    return made


# --- Compiled runners: the pure twin's fast path ------------------------------
#
# For a chain of pre/post callbacks (and around advice) and a call with N
# positional arguments, generate the straight-line code a person would write:
# call each callback with the arguments it named, check what it returned,
# rebind the local, call the function (or the around advice, which calls it).
# A per-call interpreter loop over plans costs ~20x a hand-written loop in pure
# Python; this costs about what the hand loop does.


def generated_runner(chain: Any, nargs: int, kwnames: tuple[str, ...], call_around: Any) -> Any:
    """A function ``run(func, obj, a0, ..., k0, ...)`` for calls with ``nargs``
    positional arguments then the keywords ``kwnames`` (their values, in order),
    or False where the general path is needed."""
    if chain.error or not all(name.isidentifier() and not _iskeyword(name) for name in kwnames):
        return False
    names = [f"a{i}" for i in range(nargs)]
    keywords = {name: f"k{i}" for i, name in enumerate(kwnames)}  # keyword -> its local
    passed = names + [f"{name}={local}" for name, local in keywords.items()]
    ns: dict[str, Any] = {"RE": _return_error, "NOTE": _note_callback, "AROUND": chain.around,
                          "CALL_AROUND": call_around, "STOP": StopTraining, "FINISH": finish_phase}
    body: list[str] = []
    args_list = "[" + ", ".join(names) + "]"
    kwargs_dict = "{" + ", ".join(f"{name!r}: {local}" for name, local in keywords.items()) + "}"
    for phase, steps in ((PRE, chain.pre), (POST, chain.post)):
        if phase == POST and chain.around:  # advice sees the call's arguments, not the object
            seen = names[1:] if chain.around[0].pass_obj else names
            if any(step.gate is not None for step in chain.around):  # which run: decided per call
                as_dict = "{" + ", ".join(f"{name!r}: {local}" for name, local in keywords.items()) + "}"
                body.append(f"result = CALL_AROUND(AROUND, 0, func, obj, ({''.join(n + ', ' for n in seen)}), {as_dict})")
            else:
                body += _around_code(chain.around, seen, passed[nargs:], ns)
        elif phase == POST:
            body.append(f"result = func({', '.join(passed)})")
        for i, step in enumerate(steps):
            tag = f"{'P' if phase == PRE else 'Q'}{i}"
            ns[f"S{tag}"], ns[f"F{tag}"], ns[f"G{tag}"] = step, step.fn, step.gate
            ns[f"N{tag}"] = tuple(ref.name for ref in step.refs)
            slots = step_slots(step, phase, nargs, kwnames)
            if slots is None:
                return False  # *args/**kwargs, or an argument not passed: the general path
            locals_ = names + list(keywords.values())  # slot i: the call's i-th value
            exprs = []
            for j, slot in enumerate(slots):
                if slot == SLOT_RESULT:
                    exprs.append("result")
                elif slot == SLOT_DEFAULT:
                    ns[f"D{tag}_{j}"] = step.refs[j].default
                    exprs.append(f"D{tag}_{j}")
                else:
                    exprs.append(locals_[slot])
            n_kw = len(step.kwnames)
            positional = exprs[: len(exprs) - n_kw]
            keyword = [f"{name}={expr}" for name, expr in zip(step.kwnames, exprs[len(exprs) - n_kw:])]
            call_args = (["obj"] if step.pass_obj else []) + positional + keyword
            absorb: list[str] = []  # the return contract: mirrors _rules.absorb
            if phase == POST:
                if step.consumes:
                    absorb += [f"if r is None and result is not None: raise RE(S{tag}, r, ('return_value',))",
                               "result = r"]
                else:
                    absorb.append(f"if r is not None: raise RE(S{tag}, r, ())")
            elif not exprs:
                absorb.append(f"if r is not None: raise RE(S{tag}, r, ())")
            elif len(exprs) == 1:
                absorb += [f"if r is None and {exprs[0]} is not None: raise RE(S{tag}, r, N{tag})",
                           f"{exprs[0]} = r"]
            else:
                none_checks = " or ".join(f"(r[{j}] is None and {x} is not None)" for j, x in enumerate(exprs))
                absorb += [f"if type(r) is not tuple or len(r) != {len(exprs)}: raise RE(S{tag}, r, N{tag})",
                           f"if {none_checks}: raise RE(S{tag}, r, N{tag})",
                           f"{', '.join(exprs)}, = r"]
            ns[f"R{tag}"] = steps[i + 1:]
            block = [
                "try:",
                f"    r = F{tag}({', '.join(call_args)})",
                "except STOP as e:",  # the phase's other callbacks first, then it (_rules.finish_phase)
                f"    NOTE(e, S{tag}.label, S{tag}.event)",
                f"    FINISH(e, R{tag}, obj, {args_list}, {kwargs_dict}, {'result' if phase == POST else 'None'})",
                "except BaseException as e:",
                f"    NOTE(e, S{tag}.label, S{tag}.event)",
                "    raise",
            ] + absorb
            if step.gate is not None:
                block = [f"if G{tag}.admit(obj):"] + ["    " + line for line in block]
            body += block
    body.append("return result")
    params = "".join(", " + local for local in names + list(keywords.values()))
    source = f"def run(func, obj{params}):\n" + "".join(f"    {line}\n" for line in body)
    return _define(source, f"runner of {_runs(chain)}, {nargs} positional{''.join(', ' + k for k in kwnames)}", ns, "run")


def _runs(chain: Any) -> str:
    """What a chain's runner runs, for its file name: the event, and on what."""
    event = (chain.pre or chain.post or chain.around)[0].event  # "pre-loss": the join point's "loss"
    event = event.split("-", 1)[1] if "-" in event else event
    return repr(event) + (f" on {chain.tp.__qualname__}" if isinstance(chain.tp, type) else "")


def _around_code(around: tuple[Any, ...], seen: list[str], keywords: list[str],
                 ns: dict[str, Any]) -> list[str]:
    """A runner's lines calling its around advice (none filtered) with the call's
    positional arguments ``seen`` and ``keywords`` ("name=local"), and setting
    ``result``: ``_rules.call_around``'s work, planned (its mirror). Each advice's ``proceed`` is a
    closure taking the call's positional arguments in slots, as a dispatch
    function does, and calls the next advice (or the function) with what it got."""
    pass_obj = around[0].pass_obj
    ns["TWICE"], ns["NOT_PASSED"] = _proceed_twice, NOT_PASSED
    slots = [f"p{i}" for i in range(len(seen))]
    params = "".join(f"{slot}=NOT_PASSED, " for slot in slots) + ("/, " if slots else "")
    missing = f" or {slots[-1]} is NOT_PASSED" if slots else ""
    lines: list[str] = []
    for i, step in enumerate(around):
        ns[f"SA{i}"], ns[f"FA{i}"] = step, step.fn
    for i in range(len(around)):
        inner = i + 1 < len(around)
        target = f"FA{i + 1}" if inner else "func"
        lead = ("obj, " if pass_obj else "") + (f"proceed{i + 1}, " if inner else "")
        lines += [
            f"called{i} = 0",  # then 1 (called), or 2 once its advice returned (_rules.PROCEED_*)
            f"raised{i} = None",
            f"def proceed{i}({params}*args, **kwargs):",
            f"    nonlocal called{i}, raised{i}{f', called{i + 1}' if inner else ''}",
            f"    if called{i}: raise TWICE(SA{i}, called{i})",  # at most once, during its call
            f"    called{i} = 1",
            "    try:",
            f"        if args or kwargs{missing}:",
            f"            return {target}({lead}*({_packed(slots)}), **kwargs)",
            f"        return {target}({lead}{', '.join(slots)})",
            "    except BaseException as e:",
        ]
        if inner:  # the inner advice's own error is its to note
            lines.append(f"        if e is not raised{i + 1}: NOTE(e, SA{i + 1}.label, SA{i + 1}.event)")
        lines += [f"        raised{i} = e", "        raise"]  # passed through: not advice i's
        if inner:  # advice i + 1 returned: a proceed it kept is no use now
            lines += ["    finally:", f"        if not called{i + 1}: called{i + 1} = 2"]
    lines += [
        "try:",
        f"    result = FA0({'obj, ' if pass_obj else ''}proceed0{''.join(', ' + arg for arg in seen + keywords)})",
        "except BaseException as e:",
        "    if e is not raised0: NOTE(e, SA0.label, SA0.event)",
        "    raise",
        "finally:",
        "    if not called0: called0 = 2",
    ]
    return lines


def _packed(slots: list[str]) -> str:
    """The arguments a call passed by position, as a tuple: the slots up to the
    first one not passed, then ``args`` (those past the slots)."""
    return " else ".join(
        f"({', '.join(slots[:i + 1])},) + args if {slot} is not NOT_PASSED"
        for i, slot in reversed(list(enumerate(slots)))) + (" else args" if slots else "args")


def emit_runner(steps: tuple[EmitStep, ...]) -> Callable[..., None]:
    """``run(target, name, kwargs)``: the steps of one call shape as straight-line
    code (see runner; the mirror of ``_rules.run_emit_steps``), each listener
    called with the keywords it takes, named one by one (cheaper than ``**kwargs``, which also passes them all)."""
    ns: dict[str, Any] = {"NOTE": _note_callback, "RETURNED": _emit_return_error, "STOP": StopTraining,
                          "FINISH": finish_emit}
    body: list[str] = []
    for i, (fn, gate, take, names, label) in enumerate(steps):
        ns[f"F{i}"], ns[f"G{i}"], ns[f"L{i}"] = fn, gate, label
        passed = "".join(f", {key}=kwargs[{key!r}]" for key in names)  # names: all it takes
        ns[f"R{i}"] = steps[i + 1:]
        block = [
            "try:",
            f"    r = F{i}(target{passed})",
            "except STOP as e:",  # the other listeners first, then it (finish_emit)
            f"    NOTE(e, L{i}, name)",
            f"    FINISH(e, R{i}, target, name, kwargs)",
            "except BaseException as e:",
            f"    NOTE(e, L{i}, name)",
            "    raise",
            f"if r is not None: raise RETURNED(L{i}, name, r)",
        ]
        if gate is not None:
            block = [f"if G{i}.admit(target):"] + ["    " + line for line in block]
        body += block
    source = "def run(target, name, kwargs):\n" + "".join(f"    {line}\n" for line in body or ["pass"])
    listeners = ", ".join(step.label for step in steps)
    return cast(Callable[..., None], _define(source, f"emit runner of {listeners or 'no listener'}", ns, "run"))
