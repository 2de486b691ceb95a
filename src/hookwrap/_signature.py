"""What a callback takes, planned at registration: which arguments of a join point
each callback gets, read once, and readers that hand one value to a method.

A join point's parameters are read with ``inspect`` once (``JoinPointSpec``);
each callback's parameters are matched to them by name when it is registered
(``plan_step``), giving a dispatch ``Step`` that the per-call code follows
without looking at a signature again. A callback's parameters are read once per
code object (``callback_parameters``): a callback registered and removed in a
loop, or a new closure over the same ``def``, is not read with ``inspect`` again.

A reader (``reader``) hands one value of a join point's event to a method of a
callback object, with a signature naming that value, so the registration plans
it like a function asking for it; the shipped callbacks (hookwrap.torch) attach
through it. A reader fits every kind of join point: on one without an object (a
plain or woven module function, a staticmethod) the registration plans its twin
that takes no ``self`` and hands the callback ``None`` for the object. A callback
that reads different values on different join points registers
``per_join_point(...)``, whose choice is made when each join point plans it, once.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from types import CodeType, FunctionType, MethodType
from typing import Any, Callable

from ._dispatch import ArgRef, Step
from ._policy import (
    AROUND,
    ERROR,
    EXCEPTION,
    FUNCTION,
    KW_ONLY,
    MAX_CALLBACK_ARGS,
    MISSING,
    POS_ONLY,
    POS_OR_KW,
    POST,
    PRE,
    RETURN_VALUE,
    VAR_KW,
    VAR_POS,
)
from .errors import CallbackSignatureError, safe_repr

__all__ = [
    "JoinPointSpec",
    "callable_label",
    "callback_parameters",
    "for_join_point",
    "per_join_point",
    "plan_step",
    "reader",
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
            params = list(signature.parameters.values())
            # Annotated `-> None`: callbacks watching its result would watch nothing.
            self.returns_none = signature.return_annotation in (None, "None")
        except (TypeError, ValueError):
            # A builtin without a signature: only *args/**kwargs are known.
            params = [_P("args", _P.VAR_POSITIONAL), _P("kwargs", _P.VAR_KEYWORD)]
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
