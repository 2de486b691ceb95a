"""Per-call dispatch, pure Python twin of ``_fast.pyx``.

Both modules export the same names with the same behaviour; ``_dispatch`` picks
one. Everything here runs on every call of a join point, so it only follows
plans built at registration (``_signature.py``, ``_chains.py``): no
``inspect``, no sorting, no string formatting unless an error is being raised.
Keep the two files in step: the test suite runs against both.
"""

from __future__ import annotations

import inspect
from keyword import iskeyword as _iskeyword
from types import FunctionType, MethodType
from typing import Any, Callable, NamedTuple, cast

from .errors import note_callback as _note_callback
from .errors import emit_return_error as _emit_return_error
from .errors import check_var_value as _check_var_value
from .errors import missing_argument as _missing_argument
from .errors import proceed_twice as _proceed_twice
from .errors import return_error as _return_error
from .errors import StopTraining as _StopTraining

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
_OBJECT_GETATTRIBUTE: Any = object.__getattribute__  # an instance's own attribute, whatever its class's
# Where a class keeps its record (``_owners.ClassRecord``).
RECORD_ATTR = "__hookwrap_class__"
# The pure twin stores a join point's dispatch function, which carries it here.
JOIN_POINT_ATTR = "__hookwrap_join_point__"

# Where a join point's chains come from (``_chains.Planner``); handed to each
# JoinPoint when it is built, so this module calls no registry code by name.
#   planner.type_chain(jp, tp) -> Chain         the chain for instances of tp
#   planner.instance_chain(state, jp, type_chain) -> Chain
#   planner.wrapped_runner(func) -> what runs the chain of a coroutine or generator
#       function, run_wrapped(chain, func, obj, args, kwargs), or None


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

    def absorb(self, obj: Any, args: list[Any], kwargs: dict[str, Any], raw: Any,
               result: Any) -> Any:
        """Apply what the callback returned (the return contract); returns the result."""
        if self.phase == ERROR:
            if raw is not None:
                raise _return_error(self, raw, ())
            return result
        if self.phase == POST:
            if self.consumes:
                if raw is None and result is not None:
                    raise _return_error(self, raw, ("return_value",))
                return raw
            if raw is not None:
                raise _return_error(self, raw, ())
            return result
        n = self.consumes
        if n == 0:
            if raw is not None:
                raise _return_error(self, raw, ())
        elif n == 1:
            ref = self.refs[0]
            if raw is None and ref.read(args, kwargs) is not None:
                raise _return_error(self, raw, (ref.name,))
            _check_var_value(self, ref, raw)
            ref.write(args, kwargs, raw)
        else:
            if type(raw) is not tuple or len(raw) != n:
                raise _return_error(self, raw, tuple(r.name for r in self.refs))
            for ref, value in zip(self.refs, raw):
                if value is None and ref.read(args, kwargs) is not None:
                    raise _return_error(self, raw, tuple(r.name for r in self.refs))
                _check_var_value(self, ref, value)
            for ref, value in zip(self.refs, raw):
                ref.write(args, kwargs, value)
        return result


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
        # its compiled runner (_compile_runner), or False.
        self.runners: dict[Any, Any] = {}

    @property
    def traced(self) -> Chain:
        """What torch.compile traces for this chain (_traced): the chain itself, as
        its steps are Python already (the compiled twin's is a pure copy)."""
        return self


class HookState:
    """Per-instance hook state: the instance's own attribute ``STATE_KEY`` (see _tiers)."""

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
                 "is_async", "run_wrapped", "planner", "spec", "tier", "_chain", "_dispatch", "_codes",
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
        self.planner = planner
        self.spec: Any = None  # its parameters, read once (signature.JoinPointSpec)
        self.tier: Any = None  # registrations on this function itself (_owners.Record)
        self._chain = _NO_CHAIN  # the chain of the last class it ran for
        self._dispatch, self._codes = _make_dispatch(self)
        self._dispatch.__dict__ = self.__dict__
        self.__dict__[JOIN_POINT_ATTR] = self  # how _dispatch.join_point_of finds it

    def forget_last_chain(self) -> None:
        """Drop the one-entry cache (it holds its class strongly; see _chains)."""
        self._chain = _NO_CHAIN

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


def _show_python_twins(get: Any, call: Any, pure_copy: Any, emit_get: Any, emit_call: Any) -> None:
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
    variants = _dispatcher(_slots(jp.func))(jp, jp.func, _dispatch)
    dispatch = variants[jp.binding]

    def traced(*args: Any, **kwargs: Any) -> Any:
        return jp.planner.traced_dispatch(jp, args, kwargs)

    # What torch.compile's Dynamo inlines in place of `dispatch` (it unwraps
    # `_torchdynamo_inline` from every function it inlines): a dispatch that
    # reads no hot cache, which changes under it (see _traced).
    dispatch._torchdynamo_inline = traced
    return dispatch, tuple(variant.__code__ for variant in variants)


# A dispatch function takes a call's first positional arguments (its "slots") as
# positional-only parameters defaulting to _NOT_PASSED, then *args and **kwargs.
# It accepts every call the function would and knows exactly what was passed and
# how (around advice and errors see the call as it was made), and the usual call
# (the function's required arguments, by position) reaches the function without
# packing them into a tuple and a dict: a `*args, **kwargs` wrapper alone costs
# ~3.8x a bare call.
_NOT_PASSED: Any = type("NotPassed", (), {"__repr__": lambda self: "<not passed>"})()
# A function with more required positional arguments takes the general path.
_MAX_SLOTS = 8


def _slots(func: Any) -> int:
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


def _dispatcher(n: int) -> Callable[..., Any]:
    """``make(jp, func, owned)``: ``n``-slot dispatch functions, one per binding,
    in binding order. They share their free variables, so that one's
    ``__code__`` can replace another's."""
    made = _dispatchers.get(n)
    if made is not None:
        return made
    slots = [f"a{i}" for i in range(n)]
    passed = ", ".join(slots)
    packed_slots = "".join(f"{slot}, " for slot in slots)
    params = "".join(f"{slot}=_NOT_PASSED, " for slot in slots) + ("/, " if slots else "")
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
            f"    if args or kwargs{f' or {slots[-1]} is _NOT_PASSED' if slots else ''}:",
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
    ns: dict[str, Any] = {"_NOT_PASSED": _NOT_PASSED, "STATE_KEY": STATE_KEY}
    exec(compile("\n".join(source) + "\n", f"<hookwrap dispatch, {n} slots>", "exec"), ns)  # noqa: S102
    made = _dispatchers[n] = cast(Callable[..., Any], ns["make"])
    return made


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
        # The dispatch functions read an instance's state as `obj.__hookwrap__`,
        # which a class of its own __getattribute__ (a proxy) may answer for
        # another object: its calls keep to this path.
        if not chain.own_getattribute:
            jp._chain = chain
    if chain.passthrough:
        return jp.func(*args, **kwargs)
    if chain.check_state:
        # The instance's own attribute, as the compiled twin reads it. Its class
        # holds STATE_KEY = None (see _owners.class_record), so a miss never
        # reaches a __getattr__ (nn.Module's, or one delegating elsewhere).
        state = (getattr(obj, STATE_KEY, None) if not chain.own_getattribute
                 else _OBJECT_GETATTRIBUTE(obj, STATE_KEY))
        if state is not None:
            cached = state.chains.get(jp)  # chain_for's hit, inline
            if cached is not None and cached.valid and cached.base is chain:
                chain = cached
            else:
                chain = state.chain_for(jp, chain)
    if chain.empty:
        return jp.func(*args, **kwargs)
    if jp.run_wrapped is not None:  # a coroutine or generator: the chain runs inside it
        return jp.run_wrapped(chain, jp.func, obj, list(args), kwargs)
    if not kwargs:
        runner = chain.runners.get(len(args))
        if runner is None and len(chain.runners) < MAX_CALL_SHAPES:
            runner = chain.runners[len(args)] = _compile_runner(chain, len(args), ())
        if runner:
            return runner(jp.func, obj, *args)
    else:
        shape = (len(args), tuple(kwargs))
        runner = chain.runners.get(shape)
        if runner is None and len(chain.runners) < MAX_CALL_SHAPES:
            runner = chain.runners[shape] = _compile_runner(chain, len(args), shape[1])
        if runner:
            return runner(jp.func, obj, *args, *kwargs.values())
    return _run_owned(chain, jp.func, obj, list(args), kwargs)


def _run_owned(chain: Chain, func: Callable[..., Any], obj: Any, args: list[Any],
               kwargs: dict[str, Any]) -> Any:
    if not chain.error:
        return _run_main(chain, func, obj, args, kwargs)
    try:
        return _run_main(chain, func, obj, args, kwargs)
    except Exception as exc:
        run_error_steps(chain, obj, args, kwargs, exc)
        raise


def _run_main(chain: Chain, func: Callable[..., Any], obj: Any, args: list[Any],
              kwargs: dict[str, Any]) -> Any:
    for step in chain.pre:
        if step.gate is None or step.gate.admit(obj):
            raw = step.invoke(obj, args, kwargs, None)
            step.absorb(obj, args, kwargs, raw, None)
    if chain.around:
        # Around advice sees the call's own arguments, without the object.
        result = call_around(chain.around, 0, func, obj,
                             tuple(args[1:] if chain.around[0].pass_obj else args), kwargs)
    else:
        result = func(*args, **kwargs)
    for step in chain.post:
        if step.gate is None or step.gate.admit(obj):
            raw = step.invoke(obj, args, kwargs, result)
            result = step.absorb(obj, args, kwargs, raw, result)
    return result


def run_error_steps(chain: Chain, obj: Any, args: list[Any], kwargs: dict[str, Any],
                    exc: BaseException) -> None:
    if isinstance(exc, _StopTraining):  # control flow, not a failure
        return
    for step in chain.error:
        if step.gate is None or step.gate.admit(obj):
            raw = step.invoke(obj, args, kwargs, exc)
            step.absorb(obj, args, kwargs, raw, None)


def call_around(around: tuple[Step, ...], index: int, func: Callable[..., Any], obj: Any,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call around advice ``index`` (skipping filtered ones), or the function.
    The advice's ``proceed`` is a closure: cheaper to make than an object."""
    n = len(around)
    pass_obj = around[0].pass_obj  # a method's advice: the function takes the object
    while index < n:
        step = around[index]
        if step.gate is None or step.gate.admit(obj):
            break
        index += 1
    else:
        return func(obj, *args, **kwargs) if pass_obj else func(*args, **kwargs)
    state = 0  # PROCEED_FRESH; then CALLED, or ENDED once the advice returned (errors)
    raised: BaseException | None = None

    def proceed(*args: Any, **kwargs: Any) -> Any:
        """Run the rest: inner advice, then the function (at most once, and only
        while the advice's own call lasts)."""
        nonlocal state, raised
        if state:
            raise _proceed_twice(step, state)
        state = 1
        try:
            if index + 1 == n:  # the innermost advice: the function itself
                return func(obj, *args, **kwargs) if pass_obj else func(*args, **kwargs)
            return call_around(around, index + 1, func, obj, args, kwargs)
        except BaseException as exc:
            raised = exc  # passed through: not the around callback's own error
            raise

    try:
        if pass_obj:
            return step.fn(obj, proceed, *args, **kwargs)
        return step.fn(proceed, *args, **kwargs)
    except BaseException as exc:
        if exc is not raised:
            _note_callback(exc, step.label, step.event)
        raise
    finally:
        if not state:  # a proceed kept for later: its call is over
            state = 2


# --- Compiled runners: the pure twin's fast path ------------------------------
#
# For a chain of pre/post callbacks (and around advice) and a call with N
# positional arguments, generate the straight-line code a person would write:
# call each callback with the arguments it named, check what it returned,
# rebind the local, call the function (or the around advice, which calls it).
# A per-call interpreter loop over plans costs ~20x a hand-written loop in pure
# Python; this costs about what the hand loop does.


def _compile_runner(chain: Chain, nargs: int, kwnames: tuple[str, ...]) -> Any:
    """A function ``run(func, obj, a0, ..., k0, ...)`` for calls with ``nargs``
    positional arguments then the keywords ``kwnames`` (their values, in order),
    or False where the general path is needed."""
    if chain.error or not all(name.isidentifier() and not _iskeyword(name) for name in kwnames):
        return False
    names = [f"a{i}" for i in range(nargs)]
    keywords = {name: f"k{i}" for i, name in enumerate(kwnames)}  # keyword -> its local
    passed = names + [f"{name}={local}" for name, local in keywords.items()]
    ns: dict[str, Any] = {"RE": _return_error, "NOTE": _note_callback, "AROUND": chain.around,
                          "CALL_AROUND": call_around}
    body: list[str] = []
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
            exprs = []
            for j, ref in enumerate(step.refs):
                if ref.kind == RETURN_VALUE:
                    exprs.append("result")
                elif ref.kind in (POS_ONLY, POS_OR_KW) and ref.index < nargs:
                    exprs.append(names[ref.index])
                elif ref.kind in (POS_OR_KW, KW_ONLY) and ref.name in keywords:
                    exprs.append(keywords[ref.name])
                elif ref.kind <= KW_ONLY and phase == POST and ref.default is not MISSING:
                    ns[f"D{tag}_{j}"] = ref.default
                    exprs.append(f"D{tag}_{j}")
                else:
                    return False  # not passed positionally, *args/**kwargs: general path
            n_kw = len(step.kwnames)
            positional = exprs[: len(exprs) - n_kw]
            keyword = [f"{name}={expr}" for name, expr in zip(step.kwnames, exprs[len(exprs) - n_kw:])]
            call_args = (["obj"] if step.pass_obj else []) + positional + keyword
            block = [
                "try:",
                f"    r = F{tag}({', '.join(call_args)})",
                "except BaseException as e:",
                f"    NOTE(e, S{tag}.label, S{tag}.event)",
                "    raise",
            ]
            if phase == POST:
                if step.consumes:
                    block += [f"if r is None and result is not None: raise RE(S{tag}, r, ('return_value',))",
                              "result = r"]
                else:
                    block.append(f"if r is not None: raise RE(S{tag}, r, ())")
            elif not exprs:
                block.append(f"if r is not None: raise RE(S{tag}, r, ())")
            elif len(exprs) == 1:
                block += [f"if r is None and {exprs[0]} is not None: raise RE(S{tag}, r, N{tag})",
                          f"{exprs[0]} = r"]
            else:
                none_checks = " or ".join(f"(r[{j}] is None and {x} is not None)" for j, x in enumerate(exprs))
                block += [f"if type(r) is not tuple or len(r) != {len(exprs)}: raise RE(S{tag}, r, N{tag})",
                          f"if {none_checks}: raise RE(S{tag}, r, N{tag})",
                          f"{', '.join(exprs)}, = r"]
            if step.gate is not None:
                block = [f"if G{tag}.admit(obj):"] + ["    " + line for line in block]
            body += block
    body.append("return result")
    params = "".join(", " + local for local in names + list(keywords.values()))
    source = f"def run(func, obj{params}):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(source, "<hookwrap runner>", "exec"), ns)  # noqa: S102 - generated from plans
    return ns["run"]


def _around_code(around: tuple[Step, ...], seen: list[str], keywords: list[str],
                 ns: dict[str, Any]) -> list[str]:
    """A runner's lines calling its around advice (none filtered) with the call's
    positional arguments ``seen`` and ``keywords`` ("name=local"), and setting
    ``result``: call_around's work, planned. Each advice's ``proceed`` is a
    closure taking the call's positional arguments in slots, as a dispatch
    function does, and calls the next advice (or the function) with what it got."""
    pass_obj = around[0].pass_obj
    ns["TWICE"], ns["_NOT_PASSED"] = _proceed_twice, _NOT_PASSED
    slots = [f"p{i}" for i in range(len(seen))]
    params = "".join(f"{slot}=_NOT_PASSED, " for slot in slots) + ("/, " if slots else "")
    missing = f" or {slots[-1]} is _NOT_PASSED" if slots else ""
    lines: list[str] = []
    for i, step in enumerate(around):
        ns[f"SA{i}"], ns[f"FA{i}"] = step, step.fn
    for i in range(len(around)):
        inner = i + 1 < len(around)
        target = f"FA{i + 1}" if inner else "func"
        lead = ("obj, " if pass_obj else "") + (f"proceed{i + 1}, " if inner else "")
        lines += [
            f"called{i} = 0",  # then 1 (called), or 2 once its advice returned (errors.PROCEED_*)
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
        f"({', '.join(slots[:i + 1])},) + args if {slot} is not _NOT_PASSED"
        for i, slot in reversed(list(enumerate(slots)))) + (" else args" if slots else "args")


# --- Custom events: obj.emit(name, **kw) and hookwrap.emit(obj, name, **kw) ----


class EmitStep(NamedTuple):
    """One listener of a custom event, planned for one call shape: ``take`` holds
    the places (among the keywords emitted) of the ones it is passed, named
    ``names``; None when it takes them all."""

    fn: Callable[..., Any]
    gate: Any
    take: tuple[int, ...] | None
    names: tuple[str, ...]
    label: str


class EmitEvent:
    """One custom event's listeners on one owner, and its plan per call shape
    (the keyword names emitted, in order). The emit function below also runs
    over the compiled twin's (torch.compile traces it in place of that one's)."""

    __slots__ = ("listeners", "plans", "runners")

    def __init__(self, listeners: tuple[Any, ...]) -> None:
        self.listeners = listeners
        self.plans: dict[tuple[str, ...], tuple[EmitStep, ...]] = {}
        self.runners: dict[tuple[str, ...], Callable[..., None]] = {}  # the pure emit's


def emitter(planner: Any) -> Callable[..., None]:
    """The ``emit`` function. On a miss it asks ``planner.gather(target, tp, name)``
    for the event's listeners (which it caches on their owner) and
    ``planner.plan(event, shape, tp, name)`` for a call shape's steps (which it
    keeps in ``event.plans``, and their ``emit_runner`` in ``event.runners``, for
    the first MAX_CALL_SHAPES shapes)."""

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
        except KeyError:  # plan the shape: its steps, and their runner (emit_runner)
            plan = planner.plan(event, shape, tp, name)
            run = event.runners.get(shape)
            if run is None:  # past MAX_CALL_SHAPES: planned for this call only
                _run_emit_steps(plan, target, name, kwargs)
                return
        run(target, name, kwargs)

    return emit


def _run_emit_steps(steps: tuple[EmitStep, ...], target: Any, name: str,
                    kwargs: dict[str, Any]) -> None:
    """What ``emit_runner(steps)`` does, without generating code (for a call
    shape not kept: see MAX_CALL_SHAPES)."""
    for fn, gate, _take, names, label in steps:
        if gate is not None and not gate.admit(target):
            continue
        try:
            r = fn(target, **{key: kwargs[key] for key in names})
        except BaseException as e:
            _note_callback(e, label, name)
            raise
        if r is not None:
            raise _emit_return_error(label, name, r)


def emit_runner(steps: tuple[EmitStep, ...]) -> Callable[..., None]:
    """``run(target, name, kwargs)``: the steps of one call shape as straight-line
    code (see _compile_runner), each listener called with the keywords it takes,
    named one by one (cheaper than ``**kwargs``, which also passes them all)."""
    ns: dict[str, Any] = {"NOTE": _note_callback, "RETURNED": _emit_return_error}
    body: list[str] = []
    for i, (fn, gate, take, names, label) in enumerate(steps):
        ns[f"F{i}"], ns[f"G{i}"], ns[f"L{i}"] = fn, gate, label
        passed = "".join(f", {key}=kwargs[{key!r}]" for key in names)  # names: all it takes
        block = [
            "try:",
            f"    r = F{i}(target{passed})",
            "except BaseException as e:",
            f"    NOTE(e, L{i}, name)",
            "    raise",
            f"if r is not None: raise RETURNED(L{i}, name, r)",
        ]
        if gate is not None:
            block = [f"if G{i}.admit(target):"] + ["    " + line for line in block]
        body += block
    source = "def run(target, name, kwargs):\n" + "".join(f"    {line}\n" for line in body or ["pass"])
    exec(compile(source, "<hookwrap emit runner>", "exec"), ns)  # noqa: S102 - generated from plans
    return cast(Callable[..., None], ns["run"])
