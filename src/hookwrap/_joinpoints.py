"""Join points as registrations see them: finding them, what a callback they call
takes, and what may be registered on them.

* Finding join points: naming those Python did not name, finding them on a class
  (cached in its record), every join point known (for a global callback's check).
* What a callback takes, planned at registration: a join point's parameters are
  read with ``inspect`` once (``JoinPointSpec``); each callback's parameters are
  matched to them by name when it is registered (``plan_step``), giving a dispatch
  ``Step`` that the per-call code follows without looking at a signature again. A
  callback's parameters are read once per code object (``callback_parameters``): a
  callback registered and removed in a loop, or a new closure over the same
  ``def``, is not read with ``inspect`` again.
* Readers (``reader``): one value of a join point's event handed to a method of a
  callback object, with a signature naming that value, so the registration plans
  it like a function asking for it; the shipped callbacks (hookwrap.torch) attach
  through it. A reader fits every kind of join point: on one without an object (a
  plain or woven module function, a staticmethod) the registration plans its twin
  that takes no ``self`` and hands the callback ``None`` for the object. A callback
  that reads different values on different join points registers
  ``per_join_point(...)``, whose choice is made when each join point plans it, once.
* Registration-time checks: an entry's shape, that its event exists, that the
  callback's signature fits (a ``Step`` planned once, kept on the entry), and that
  a callback meant to be saved with its object pickles.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import weakref
from types import CodeType, FunctionType, MethodType, ModuleType
from typing import Any, Callable, Iterable, Iterator

from ._dispatch import ArgRef, JoinPoint, Step
from ._entries import CUSTOM, PHASES, Registration, normalize, parse_event
from ._owners import class_record, function_record, is_builtin_type, lock, with_subclasses
from ._rules import (
    AROUND,
    ERROR,
    EXCEPTION,
    FUNCTION,
    JOIN_POINT_ATTR,
    KW_ONLY,
    MAX_CALLBACK_ARGS,
    METHOD,
    MISSING,
    POST,
    POS_ONLY,
    POS_OR_KW,
    PRE,
    RETURN_VALUE,
    VAR_KW,
    VAR_POS,
)
from .errors import CallbackSignatureError, HookError, UnknownEventError, closest, safe_repr

__all__ = [
    "JoinPointSpec",
    "PHASE_CODES",
    "all_join_points",
    "callable_label",
    "callback_parameters",
    "check_custom_callback",
    "check_entry",
    "check_event",
    "check_pair",
    "check_registration",
    "declared_custom_events",
    "find_join_point",
    "find_owner",
    "fires",
    "fitting_step",
    "for_join_point",
    "has_join_points",
    "join_point_of",
    "join_points",
    "known_events",
    "name_join_point",
    "per_join_point",
    "pickle_problem",
    "plan_step",
    "planned_step",
    "reader",
    "spec_of",
    "target_join_points",
    "track_join_point",
]


# --- Join points' and callbacks' parameters --------------------------------------

_P = inspect.Parameter
_KINDS = {
    _P.POSITIONAL_ONLY: POS_ONLY,
    _P.POSITIONAL_OR_KEYWORD: POS_OR_KW,
    _P.KEYWORD_ONLY: KW_ONLY,
    _P.VAR_POSITIONAL: VAR_POS,
    _P.VAR_KEYWORD: VAR_KW,
}
_RETURN_REF = ArgRef(RETURN_VALUE, -1, "return_value", MISSING, None)
_EXCEPTION_REF = ArgRef(EXCEPTION, -1, "exception", MISSING, None)
PHASE_NAMES = {PRE: "pre", POST: "post", AROUND: "around", ERROR: "error"}
# The extra name each phase may ask for, beside the join point's arguments.
_SPECIAL = {POST: ("return_value", _RETURN_REF), ERROR: ("exception", _EXCEPTION_REF)}
_SPECIAL_NAMES = frozenset(name for name, _ in _SPECIAL.values())


class JoinPointSpec:
    """The parameters of a join point, with one ArgRef per name."""

    __slots__ = ("event", "func", "has_obj", "is_async", "obj_name", "refs", "returns_none", "where",
                 "__weakref__")

    def __init__(self, jp: Any) -> None:
        self.event: str = jp.event
        self.func = jp.func  # what hookwrap.extend.JoinPointInfo.function shows
        self.where = _join_point_label(jp)
        self.has_obj = jp.binding != FUNCTION
        # Its callbacks may be awaited: an async def's, or an async generator's.
        self.is_async = bool(jp.is_async) or inspect.isasyncgenfunction(jp.func)
        try:
            signature = inspect.signature(jp.func)
            if self.has_obj and _hides_its_signature(signature):
                signature = _signature_behind(jp.func, signature)
            params = list(signature.parameters.values())
            # Annotated `-> None`: callbacks watching its result would watch nothing.
            self.returns_none = signature.return_annotation in (None, "None")
        except (TypeError, ValueError):
            # A builtin without a signature: only *args/**kwargs are known.
            params = [_P("self", _P.POSITIONAL_ONLY)] if self.has_obj else []
            params += [_P("args", _P.VAR_POSITIONAL), _P("kwargs", _P.VAR_KEYWORD)]
            self.returns_none = False
        self.obj_name: str | None = None
        if self.has_obj:
            if not params or params[0].kind not in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
                raise CallbackSignatureError(
                    f"{self.where} is hookable as a method but takes no positional "
                    f"`self`/`cls` parameter; give it one, or make it a staticmethod."
                )
            self.obj_name = params[0].name
        n_positional = sum(1 for p in params if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD))
        keyword_names = frozenset(
            p.name for p in params if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)
        )
        positional_defaults: list[Any] = []
        self.refs: dict[str, ArgRef] = {}
        for index, p in enumerate(params):
            kind = _KINDS[p.kind]
            if kind == POS_ONLY:
                extra: Any = tuple(positional_defaults)
            elif kind == VAR_KW:
                extra = keyword_names
            else:
                extra = None
            if kind == VAR_POS:
                index = n_positional
            if not (self.has_obj and index == 0 and kind in (POS_ONLY, POS_OR_KW)):
                self.refs[p.name] = ArgRef(kind, index, p.name, p.default, extra)
            if kind in (POS_ONLY, POS_OR_KW):
                positional_defaults.append(p.default)

    def valid_names(self, phase: int) -> str:
        names = list(self.refs)
        if phase in _SPECIAL:
            names.append(_SPECIAL[phase][0])
        return ", ".join(names) if names else "(none)"


def _hides_its_signature(signature: inspect.Signature) -> bool:
    """A method's signature that starts with ``*args``: a decorator's wrapper."""
    params = list(signature.parameters.values())
    return bool(params) and params[0].kind == _P.VAR_POSITIONAL


def _signature_behind(func: Any, signature: inspect.Signature) -> inspect.Signature:
    """The signature of a method wrapped by a decorator that hides it behind
    ``(*args, **kwargs)`` and sets no ``__wrapped__`` (DeepSpeed's
    ``instrument_w_nvtx``, on ``DeepSpeedEngine.backward``): that of the one function
    its closure holds, the method it passes its arguments to. Else the arguments
    pass through as they are: ``self``, then ``*args`` and ``**kwargs`` (callbacks
    may name ``args`` and ``kwargs``), and every call runs as it did unwoven."""
    inner = []
    for cell in getattr(func, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
        if type(value) is FunctionType:
            inner.append(value)
    if len(inner) == 1:
        behind = inspect.signature(inner[0])
        first = next(iter(behind.parameters.values()), None)
        if first is not None and first.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
            return behind
    return signature.replace(parameters=[_P("self", _P.POSITIONAL_ONLY), *signature.parameters.values()])


# code object -> {defaults shape: parameters}. Weakly keyed: a code object made at
# run time (exec) goes with its functions. The parameters keep only what a plan
# reads (name, kind, whether there is a default), never a default value itself.
_parameters_by_code: weakref.WeakKeyDictionary[CodeType, dict[Any, list[inspect.Parameter]]] = (
    weakref.WeakKeyDictionary()
)
_parameters_lock = threading.Lock()
_HAS_DEFAULT = object()


def _plain(fn: Any) -> bool:
    """A function whose signature its code object tells (no __wrapped__/__signature__)."""
    return type(fn) is FunctionType and "__wrapped__" not in fn.__dict__ \
        and "__signature__" not in fn.__dict__


def callback_parameters(fn: Any) -> list[inspect.Parameter]:
    """``fn``'s parameters as ``inspect.signature`` gives them, read once per code
    object for plain functions and methods bound to them (defaults: a marker)."""
    if type(fn) is MethodType and _plain(fn.__func__):
        params = callback_parameters(fn.__func__)
        if params and params[0].kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
            return params[1:]  # what binding takes, as inspect does
        return params
    if not _plain(fn):
        return list(inspect.signature(fn).parameters.values())
    shape = (len(fn.__defaults__ or ()), tuple(fn.__kwdefaults__ or ()))
    with _parameters_lock:
        known = _parameters_by_code.get(fn.__code__)
        cached = known.get(shape) if known is not None else None
    if cached is not None:
        return list(cached)
    params = [p.replace(default=_HAS_DEFAULT if p.default is not _P.empty else _P.empty,
                        annotation=_P.empty)
              for p in inspect.signature(fn).parameters.values()]
    with _parameters_lock:
        _parameters_by_code.setdefault(fn.__code__, {})[shape] = params
    return list(params)


def callable_label(fn: Any) -> str:
    """``module.qualname (file.py:12)``: how errors and notes name a callback."""
    target = getattr(fn, "__func__", fn)
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    code = getattr(target, "__code__", None)
    if code is None:
        return name
    return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"


def plan_step(fn: Callable[..., Any], phase: int, spec: JoinPointSpec, pass_obj: bool,
              gate: Any = None) -> Any:
    """Match a callback's parameters to the join point by name; return a dispatch Step.

    Raises CallbackSignatureError naming the callback, the event and the fix.
    """
    event = f"{PHASE_NAMES[phase]}-{spec.event}"
    label = callable_label(fn)
    where = f"callback {label} for event {event!r} of {spec.where}"
    if gate is not None:
        gate.label = f"{label} for event {event!r}"
    if not callable(fn):
        raise CallbackSignatureError(f"{where}: {safe_repr(fn)} is not callable; register a function.")
    try:
        params = callback_parameters(fn)
    except (TypeError, ValueError) as exc:
        raise CallbackSignatureError(
            f"{where}: cannot read its signature ({exc}); wrap it in a `def` that names "
            f"the arguments it needs."
        ) from None
    if not spec.is_async and _makes_awaitable(fn):
        raise CallbackSignatureError(
            f"{where}: it is an async def or generator function, but the join point is not async: "
            f"its coroutine or generator would be taken for its result and never run. Make it a "
            f"plain def."
        )
    generator = _makes_generator(fn) if spec.is_async else ""
    if generator:
        # An async join point awaits a coroutine; a generator is not one.
        kind = "an async generator function (an async def with yield)" if generator == "async" \
            else "a generator function (a def with yield)"
        raise CallbackSignatureError(
            f"{where}: it is {kind}: calling it only makes a generator, which would be taken for "
            f"its result and never run. Make it an async def without yield, or a plain def."
        )
    if phase == AROUND:
        _check_around(params, pass_obj, spec, where)
        return Step(fn, event, label, phase, pass_obj, (), (), gate)
    for p in params:
        if p.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD):
            raise CallbackSignatureError(
                f"{where}: takes {'*' if p.kind == _P.VAR_POSITIONAL else '**'}{p.name}, but "
                f"callbacks get only the arguments they name. Name them instead. Valid "
                f"names: {spec.valid_names(phase)}."
            )
    if pass_obj:
        if not params or params[0].kind == _P.KEYWORD_ONLY:
            raise CallbackSignatureError(
                f"{where}: takes no `self` parameter. Its first parameter receives the "
                f"hooked object; write `def {getattr(fn, '__name__', 'callback')}(self, ...)`. "
                f"Valid names (after `self`): {spec.valid_names(phase)}."
            )
        first = params[0]
        # return_value and exception name no argument, but are never the object either.
        if (first.name in spec.refs or first.name in _SPECIAL_NAMES) and first.name != spec.obj_name:
            what = f"the argument {first.name!r}" if first.name in spec.refs else \
                ("the result" if first.name == "return_value" else "the exception")
            raise CallbackSignatureError(
                f"{where}: its first parameter {first.name!r} would receive the hooked "
                f"object, not {what}. Add `self` before it: "
                f"`def {getattr(fn, '__name__', 'callback')}(self, {first.name}, ...)`. "
                f"Valid names (after `self`): {spec.valid_names(phase)}."
            )
        params = params[1:]
    refs: list[Any] = []
    kwnames: list[str] = []
    by_keyword = False  # after a skipped parameter, the rest go by keyword
    special = _SPECIAL.get(phase)
    for p in params:
        if special is not None and p.name == special[0]:
            ref = special[1]
        elif p.name in spec.refs:
            ref = spec.refs[p.name]
        elif p.default is not _P.empty:
            by_keyword = True  # not an argument of this join point: its default stays
            continue
        else:
            extra = ""
            if p.name == "return_value":
                extra = " (return_value is given to post callbacks only)"
            elif p.name == "exception":
                extra = " (exception is given to error callbacks only)"
            raise CallbackSignatureError(
                f"{where}: asks for {p.name!r}, which {spec.where} does not have{extra}. "
                f"Valid names: {spec.valid_names(phase)}."
            )
        if by_keyword or p.kind == _P.KEYWORD_ONLY:
            if p.kind == _P.POSITIONAL_ONLY:
                raise CallbackSignatureError(
                    f"{where}: positional-only parameter {p.name!r} follows a parameter that "
                    f"is not passed; make it a normal parameter."
                )
            kwnames.append(p.name)
        refs.append(ref)
    if len(refs) > MAX_CALLBACK_ARGS:
        raise CallbackSignatureError(
            f"{where}: asks for {len(refs)} arguments; a callback may ask for at most "
            f"{MAX_CALLBACK_ARGS}. Ask for fewer, or read them from the object or one argument."
        )
    return Step(fn, event, label, phase, pass_obj, tuple(refs), tuple(kwnames), gate)


def _makes_awaitable(fn: Any) -> bool:
    """Does calling ``fn`` make a coroutine or generator instead of running it?"""
    target = getattr(fn, "__func__", fn)
    if isinstance(target, functools.partial):
        target = target.func
    return inspect.iscoroutinefunction(target) or inspect.isgeneratorfunction(target) \
        or inspect.isasyncgenfunction(target)


def _makes_generator(fn: Any) -> str:
    """'async' or 'sync' when calling ``fn`` makes a generator; '' otherwise."""
    target = getattr(fn, "__func__", fn)
    if isinstance(target, functools.partial):
        target = target.func
    if inspect.isasyncgenfunction(target):
        return "async"
    return "sync" if inspect.isgeneratorfunction(target) else ""


def _check_around(params: list[inspect.Parameter], pass_obj: bool, spec: JoinPointSpec, where: str) -> None:
    """Around advice is called as ``fn(self, proceed, *args, **kwargs)``, with the
    join point's arguments as the caller passed them: it takes ``*args, **kwargs``,
    or names every parameter of the join point."""
    positional = [p for p in params if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
    has_var = any(p.kind == _P.VAR_POSITIONAL for p in params)
    has_var_kw = any(p.kind == _P.VAR_KEYWORD for p in params)
    needed = 2 if pass_obj else 1
    head = "self, proceed" if pass_obj else "proceed"
    fix = (f"write `def around({head}, *args, **kwargs)` and call proceed(*args, **kwargs) once, "
           f"or name the join point's parameters after `{head}`.")
    if len(positional) < needed and not has_var:
        raise CallbackSignatureError(f"{where}: around advice is called as fn({head}, *args, **kwargs); {fix}")
    if has_var and has_var_kw:
        return
    named = {p.name for p in params[needed:] if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)}
    for ref in spec.refs.values():
        if ref.kind == VAR_POS and not has_var:
            raise CallbackSignatureError(f"{where}: the join point takes *{ref.name}, which the advice "
                                         f"cannot be given; {fix}")
        if ref.kind == VAR_KW and not has_var_kw:
            raise CallbackSignatureError(f"{where}: the join point takes **{ref.name}, which the advice "
                                         f"cannot be given; {fix}")
        if ref.kind == POS_ONLY:
            passed = has_var or len(positional) - needed > ref.index - int(pass_obj)
        elif ref.kind == POS_OR_KW:
            passed = ref.name in named or has_var or has_var_kw
        elif ref.kind == KW_ONLY:
            passed = ref.name in named or has_var_kw
        else:
            passed = True
        if not passed:
            raise CallbackSignatureError(f"{where}: the join point's argument {ref.name!r} cannot be "
                                         f"passed to the advice; {fix}")


def _join_point_label(jp: Any) -> str:
    owner = jp.owner
    name = jp.attr_name or getattr(jp.func, "__name__", "?")
    place = f"{owner.__qualname__}.{name}" if owner is not None else getattr(jp.func, "__qualname__", name)
    return f"join point {jp.event!r} ({place})"


# --- Readers: one value for a method of a callback object ------------------------

# What a reader calls: ``handler(obj, *extra[, value])``, then the value back where
# the contract asks for it (a pre- argument, return_value), else None. Module-level
# functions, so that pickle saves them by name, bound to the handler by a
# functools.partial: dispatch calls that through C into one Python frame. (A
# callable object's Python ``__call__`` cost ~1,900 more instructions a call.)
def _notify(handler: Any, self: Any) -> None:
    handler(self)


def _read(handler: Any, self: Any, value: Any) -> None:
    handler(self, value)


def _take(handler: Any, self: Any, value: Any) -> Any:
    handler(self, value)
    return value


def _notify_with(handler: Any, extra: tuple[Any, ...], self: Any) -> None:
    handler(self, *extra)


def _read_with(handler: Any, extra: tuple[Any, ...], self: Any, value: Any) -> None:
    handler(self, *extra, value)


def _take_with(handler: Any, extra: tuple[Any, ...], self: Any, value: Any) -> Any:
    handler(self, *extra, value)
    return value


# (takes a value, passes it back, has extra) -> the function
_READERS: dict[tuple[bool, bool, bool], Callable[..., Any]] = {
    (False, False, False): _notify, (True, False, False): _read, (True, True, False): _take,
    (False, False, True): _notify_with, (True, False, True): _read_with, (True, True, True): _take_with,
}


def _pick_by_object(with_object: Any, without_object: Any, spec: Any) -> Any:
    return with_object if spec.has_obj else without_object


def _planned_only(*args: Any) -> Any:
    raise TypeError("a per_join_point callback is called through the reader its join point chose")


# The attribute of a registered callable that chooses, per join point spec, what is planned.
PLAN_ATTR = "__hookwrap_plan__"
# A reader's phase ("pre", "post", "error"): registered for another, it would
# break the return contract at every call, so the pair is refused when attached.
READER_PHASE_ATTR = "__hookwrap_reader_phase__"


def for_join_point(fn: Any, spec: Any) -> Any:
    """What the registration of ``fn`` plans on the join point of ``spec``: ``fn``,
    or what a reader or ``per_join_point`` callable chooses for it."""
    while type(fn) is functools.partial:
        plan = fn.__dict__.get(PLAN_ATTR)
        chosen = plan(spec) if plan is not None else fn
        if chosen is fn:  # a reader with its object chooses itself
            break
        fn = chosen
    return fn


def per_join_point(owner: Any, name: str, choose: Callable[[Any], Any]) -> Callable[..., Any]:
    """A callback of ``owner`` (a ``Callback``) that is a different reader on each
    join point: ``choose(spec)`` returns it, or raises CallbackSignatureError where
    the join point cannot give what it needs (on the global tier: not attached there)."""
    made = functools.partial(_planned_only)
    shown = f"{type(owner).__name__}.{name}"
    vars(made).update(__self__=owner, __qualname__=shown, __name__=shown, **{PLAN_ATTR: choose},
                      __signature__=inspect.Signature([_P("self", _P.POSITIONAL_OR_KEYWORD)]))
    return made


def reader(handler: Callable[..., Any], event: str, name: str | None = None,
           extra: tuple[Any, ...] = ()) -> Callable[..., Any]:
    """A callback that hands one value of an event (the argument ``name``, or
    none) to a method of a ``Callback``: ``handler(obj, *extra, value)``.

    Its signature, ``(self, <name>)``, is made here, so the registration plans it
    like any function asking for that argument (and refuses a name the join point
    does not have). It returns what the contract asks: the value it took on
    ``pre-`` and for ``return_value``, else ``None``. A ``functools.partial`` of a
    module-level function: it pickles (torch.save of the hooked object) and
    deep-copies with its callback, and dispatch calls it through C.
    """
    passes = name is not None and (event.startswith("pre-") or name == "return_value")
    function = _READERS[name is not None, passes, bool(extra)]
    bound = (handler, extra) if extra else (handler,)
    made = functools.partial(function, *bound)
    without_object = functools.partial(function, *bound, None)  # self is None
    owner = handler.__self__  # type: ignore[attr-defined]
    # Named by the concrete class (describe shows "EarlyStopping.observe").
    name_shown = f"{type(owner).__name__}.{handler.__name__}" + (f"[{','.join(map(str, extra))}]" if extra else "")
    params = [_P(name, _P.POSITIONAL_OR_KEYWORD)] if name is not None else []
    for partial, head in ((made, [_P("self", _P.POSITIONAL_OR_KEYWORD)]), (without_object, [])):
        vars(partial).update(__self__=owner,  # its callback: ordering refs, callback_state
                             __qualname__=name_shown, __name__=name_shown,
                             __signature__=inspect.Signature(head + params))
    vars(made)[PLAN_ATTR] = functools.partial(_pick_by_object, made, without_object)
    vars(made)[READER_PHASE_ATTR] = event.partition("-")[0]
    return made


# --- Finding join points ---------------------------------------------------------

def join_point_of(value: Any, through_wrappers: bool = False) -> Any:
    """The JoinPoint a stored attribute is, or carries; None for anything else:
    the one way to recognise a join point.

    A join point is stored bare (compiled), as its dispatch function (pure twin),
    inside a classmethod/staticmethod, or inside a ``HookableWrapper``. The last
    two carry it as ``__hookwrap_join_point__``, read only from types that define
    it, so no arbitrary object's ``__getattr__`` runs. A function carries the mark
    only when it shares the join point's ``__dict__`` (its dispatch function does):
    ``functools.wraps`` copies the mark into a wrapper, which is not the join point.

    ``through_wrappers``: also a function wrapping one (``functools.wraps`` layers,
    followed by ``__wrapped__``). Libraries re-patch their own methods so
    (torch.optim's profile_hook_step on every optimizer class); a call of the
    wrapper reaches the join point, which fires once. Only the questions "does
    this attribute still reach that join point" ask this way.
    """
    for _ in range(_WRAPPER_DEPTH if through_wrappers else 1):
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        if type(value) is JoinPoint:
            return value
        if type(value) is not FunctionType:
            break
        found = value.__dict__.get(JOIN_POINT_ATTR)
        if found is not None and found.__dict__ is value.__dict__:
            return found
        value = value.__dict__.get("__wrapped__")
    else:
        return None
    if hasattr(type(value), JOIN_POINT_ATTR):
        return getattr(value, JOIN_POINT_ATTR)
    return None


_WRAPPER_DEPTH = 8  # functools.wraps layers followed to a join point


# Every join point, weakly: a global callback is checked against those of its event.
_all_join_points: weakref.WeakSet[Any] = weakref.WeakSet()


def all_join_points() -> list[Any]:
    return list(_all_join_points)


def track_join_point(jp: Any) -> Any:
    _all_join_points.add(jp)
    return jp


def untrack_join_point(jp: Any) -> None:
    """A join point taken out of where it was installed (its weave removed): no longer
    one of ``all_join_points``, so a global callback registered later, or the update
    axes a counting callback reads, do not find it while it waits to be collected. A
    call of it that something still holds runs as before."""
    _all_join_points.discard(jp)


def name_join_point(value: Any, owner: type, name: str) -> None:
    """``__set_name__`` for a join point that Python did not name: stored in a class
    after its creation, inside a classmethod/staticmethod, or (pure twin) stored as
    its dispatch function."""
    jp = join_point_of(value)
    if jp is None:
        return
    if type(value) is JoinPoint:
        value.__set_name__(owner, name)
        return
    jp.owner, jp.attr_name = owner, name
    if not jp.explicit_event:
        jp.event = name
    if type(value) is FunctionType and jp.binding == FUNCTION:
        jp.rebind(METHOD)  # a plain function in a class body: an instance method
        # Called before now (pure twin, a class that is not Hookable), it ran as a
        # function: what was planned for that reads `self` as an argument.
        jp.spec = None
        jp.forget_last_chain()
        if jp.record is not None:
            function_record(jp).changed(None)
        jp.planner.named(jp, owner, name)  # as the compiled twin's __set_name__ does


def find_owner(jp: Any) -> tuple[type, str] | None:
    """The class and attribute holding ``jp`` where nothing named it: the pure twin
    stores a join point as a plain function, which Python names in no class
    (``__set_name__``), and a class that is not ``Hookable`` does not scan itself.
    Found by the function's ``__qualname__`` (``Plain.step``: defined in a class
    body), for a registration through the attribute (``Plain.step.before(fn)``);
    None for a plain function. Walks the classes once per join point: only until
    it is named."""
    qualname = getattr(jp.func, "__qualname__", "")
    owner_name = qualname.rpartition(".")[0]
    if not owner_name or owner_name.endswith("<locals>"):
        return None  # a module's function, or one defined inside a function
    module = getattr(jp.func, "__module__", None)
    for klass in with_subclasses(object):
        if klass.__qualname__ != owner_name or klass.__module__ != module or is_builtin_type(klass):
            continue
        for attr, value in list(vars(klass).items()):
            if join_point_of(value) is jp:
                return klass, attr
    return None


def join_points(tp: type) -> dict[str, Any]:
    """Normalized event name -> the most derived join point of that event on ``tp``.
    Cached in ``tp``'s record; weaving (``changed_class(structure=True)``) clears it."""
    try:
        record = class_record(tp)
    except HookError:  # a built-in type: nothing to cache on, and nothing to find
        return _scan(tp)
    assert record is not None
    found = record.join_points
    if found is None:
        found = _scan(tp)
        record.join_points = found
    return found


def has_join_points(tp: type) -> bool:
    """Does ``tp`` have any join point? Asked without keeping a record on ``tp``."""
    if class_record(tp, create=False) is not None:
        return bool(join_points(tp))
    return any(join_point_of(value) is not None for klass in tp.__mro__ for value in list(vars(klass).values()))


def _scan(tp: type) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with lock:
        for klass in tp.__mro__:
            for attr, value in list(vars(klass).items()):
                jp = join_point_of(value)
                if jp is not None:
                    if jp.owner is None:
                        name_join_point(value, klass, attr)
                    found.setdefault(normalize(jp.event), jp)
                    continue
                jp = join_point_of(value, through_wrappers=True)
                if jp is not None and jp.attr_name == attr and jp.owner is not None \
                        and issubclass(tp, jp.owner):
                    # A method join point its class (or a library) wrapped again in
                    # place (functools.wraps): still this class's join point. A wrapper
                    # of any other join point is only a function calling it.
                    found.setdefault(normalize(jp.event), jp)
    return found


def target_join_points(target: Any) -> dict[str, Any]:
    """Normalized event name -> join point, for what a callback object attaches to:
    a class (its join points), a hookable function (itself), a module (its hookable
    functions), or an instance (its class's)."""
    if isinstance(target, ModuleType):
        found = (join_point_of(value) for value in list(vars(target).values()))
        return {normalize(jp.event): jp for jp in found if jp is not None and jp.owner is None}
    jp = join_point_of(target)
    if jp is not None and jp.owner is None:
        return {normalize(jp.event): jp}
    return join_points(target if isinstance(target, type) else type(target))


def declared_custom_events(tp: type) -> set[str]:
    """The custom event names ``tp`` declares in ``emits`` (with its bases)."""
    names: set[str] = set()
    for klass in tp.__mro__:
        emits = vars(klass).get("emits")
        if isinstance(emits, str):
            raise HookError(f"{klass.__qualname__}.emits must be a list of event names, not a string.")
        if emits:
            names.update(emits)
    return names


def known_events(tp: type) -> list[str]:
    """Every event of ``tp``: each phase of each join point, then its custom events."""
    events = [f"{p}-{jp.event}" for jp in join_points(tp).values() for p in PHASES]
    return events + sorted(declared_custom_events(tp))


def find_join_point(tp: type, name: str, where: str) -> Any:
    """The join point named ``name`` on ``tp``, or UnknownEventError with the closest names."""
    jp = join_points(tp).get(normalize(name))
    record = class_record(tp, create=False)
    if jp is None and record is not None:
        # A join point set on the class after its first lookup (not by weave): look again.
        record.join_points = None
        jp = join_points(tp).get(normalize(name))
    if jp is None:
        known = sorted({jp.event for jp in join_points(tp).values()})
        raise UnknownEventError(
            f"{where}: {tp.__qualname__} has no join point {name!r}."
            + closest(name, known)
            + f" Join points of {tp.__qualname__}: {', '.join(known) or '(none)'}. "
            f"Make the method hookable with @hookwrap.hookable, or, in code you cannot edit, "
            f"hookwrap.weave({tp.__name__}, {name!r})."
        )
    return jp


def spec_of(jp: Any) -> JoinPointSpec:
    """The join point's parameters, read once (again if its event was renamed)."""
    spec = jp.spec
    if spec is None or spec.event != jp.event:
        spec = jp.spec = JoinPointSpec(jp)
    return spec  # type: ignore[no-any-return]


def fires(jp: Any, tp: Any) -> bool:
    """False when ``tp`` overrides this join point: the call is a ``super()`` call
    from inside the override, whose callbacks already ran."""
    name = jp.attr_name
    if name is None or not isinstance(tp, type):
        return True
    for klass in tp.__mro__:
        if name in vars(klass):
            return join_point_of(vars(klass)[name], through_wrappers=True) is jp
    return True


# --- Checking a registration against them ----------------------------------------

PHASE_CODES = {"pre": PRE, "post": POST, "around": AROUND, "error": ERROR}


def check_pair(item: Any, where: str, known: Iterable[str] = ()) -> Registration:
    """An ``(event, fn)`` entry as a Registration (its event parsed once)."""
    if isinstance(item, Registration):
        return item
    if not (isinstance(item, tuple) and len(item) == 2):
        raise HookError(
            f"{where}: entries are (event, callback) pairs like ('pre-step', fn), got {safe_repr(item)}."
        )
    return Registration(item[0], item[1], None, parse_event(item[0], where, known))


def check_event(tp: type, phase: str, name: str, where: str) -> Any:
    """Check that ``tp`` has this event; returns its join point (None for custom events)."""
    if phase != CUSTOM:
        jp = find_join_point(tp, name, where)
        if not fires(jp, tp):
            # A class that overrides a woven method with a plain one (a Hookable
            # subclass's overrides stay hookable): its calls never reach the join point.
            owner = jp.owner.__qualname__ if jp.owner is not None else "its base"
            raise HookError(
                f"{where}: {tp.__qualname__} overrides {jp.attr_name}() of {owner}, where it was "
                f"made hookable, so callbacks of {name!r} would never run for it. Weave the "
                f"override too: hookwrap.weave({tp.__qualname__}, {jp.attr_name!r})."
            )
        return jp
    if name not in declared_custom_events(tp):
        raise UnknownEventError(
            f"{where}: {tp.__qualname__} declares no custom event {name!r}."
            + closest(name, known_events(tp))
            + f" Declare it in the class: `emits = ({name!r},)`."
        )
    return None


def check_entry(tp: type, item: Any, where: str) -> Registration:
    """Check an ``(event, fn)`` entry for class ``tp``: shape, event, signature."""
    registration = check_pair(item, where, _known_on_demand(tp))
    check_registration(tp, registration, where)
    return registration


def _known_on_demand(tp: type) -> Iterator[str]:
    """The events of ``tp``, computed only if an error lists the closest ones."""
    yield from known_events(tp)


def check_registration(tp: type, registration: Registration, where: str) -> None:
    """Check a parsed entry against class ``tp``: its event exists, its callback fits."""
    jp = check_event(tp, registration.phase, registration.name, where)
    if jp is None:
        check_custom_callback(registration.fn, where, pass_obj=True)
    else:
        planned_step(registration, spec_of(jp))


def planned_step(registration: Registration, spec: JoinPointSpec) -> Any:
    """The dispatch Step of ``registration`` on the join point of ``spec``: its
    signature is read once (raising CallbackSignatureError if it does not fit),
    and the Step kept on the registration, weakly keyed by the join point."""
    steps = registration.steps
    if steps is None:
        steps = registration.steps = weakref.WeakKeyDictionary()
    step = steps.get(spec)
    if step is None:
        options = registration.options
        fn = for_join_point(registration.fn, spec)
        step = steps[spec] = plan_step(fn, PHASE_CODES[registration.phase], spec,
                                       spec.has_obj, options.gate if options is not None else None)
    if type(step) is _Unfit:
        raise step.error.with_traceback(None)
    return step


class _Unfit:
    """planned_step's record of a join point a global callback does not fit."""

    __slots__ = ("error",)

    def __init__(self, error: CallbackSignatureError) -> None:
        self.error = error


def fitting_step(registration: Registration, spec: JoinPointSpec) -> Any:
    """A global registration's Step on this join point, or None where it does not fit
    (the global tier reaches every join point of its event's name, in unrelated
    classes; it runs where its signature fits). Decided once per join point."""
    try:
        return planned_step(registration, spec)
    except CallbackSignatureError as exc:
        # Without its traceback, whose frames hold ``spec`` (the weak key) alive.
        registration.steps[spec] = _Unfit(exc.with_traceback(None))
        return None


def check_custom_callback(fn: Any, where: str, pass_obj: bool) -> None:
    """A custom event callback gets keywords by name: no ``*args``/``**kwargs``."""
    if not callable(fn):
        raise HookError(f"{where}: the callback {safe_repr(fn)} is not callable; register a function.")
    try:
        params = callback_parameters(fn)
    except (TypeError, ValueError):
        return
    if pass_obj and not params:
        raise HookError(
            f"{where}: callback {callable_label(fn)} takes no `self` parameter; its first "
            f"parameter receives the object that emits the event."
        )
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise HookError(
                f"{where}: callback {callable_label(fn)} takes {'*' if p.kind == p.VAR_POSITIONAL else '**'}"
                f"{p.name}; name the keywords it needs instead."
            )


def pickle_problem(fn: Any) -> str | None:
    """Why pickle cannot save ``fn`` (it saves a function by its module and name),
    or None when it can, or cannot tell (a callable object: pickle decides)."""
    if isinstance(fn, functools.partial):
        return pickle_problem(fn.func)
    if isinstance(fn, MethodType) or not isinstance(fn, FunctionType):
        return None  # a bound method saves its object; other callables, themselves
    qualname = fn.__qualname__
    if "<lambda>" in qualname:
        return "a lambda"
    if "<locals>" in qualname:
        return "a function defined inside another function"
    found: Any = sys.modules.get(fn.__module__)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not fn:
        return f"not found as {fn.__module__}.{qualname}"
    return None
