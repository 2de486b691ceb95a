"""``@hookable``: make a function or method a join point.

Plain functions (``def``/``async def``, in a class body or not) become a compiled
``JoinPoint``: a descriptor that binds like a function (vectorcall, no bound
object built per attribute lookup) and dispatches the callbacks of its event.
A classmethod or staticmethod of a plain function stays one, around such a
join point (their own ``__get__`` binds at C speed; wrapt's classmethod binding
costs about a microsecond a call). Every other kind of callable -- a callable
object, a builtin, a partial -- is wrapped in a ``wrapt.FunctionWrapper``,
which gets binding right for each of them, around the same ``JoinPoint``.
"""

from __future__ import annotations

import functools
import inspect
from types import FunctionType
from typing import (
    Any,
    Callable,
    Concatenate,
    ParamSpec,
    Protocol,
    Self,
    SupportsIndex,
    TypeVar,
    overload,
)

import wrapt

from ._chains import PLANNER
from ._dispatch import JoinPoint, as_attribute, join_point_of
from ._policy import CLASSMETHOD, FUNCTION, JOIN_POINT_ATTR
from ._joinpoints import name_join_point, track_join_point
from ._registration import Handle, register
from .errors import HookError, safe_repr
from ._entries import PHASES

__all__ = ["HookableCallable", "HookableClassCallable", "HookableWrapper", "hookable", "make_join_point"]

P = ParamSpec("P")
Q = ParamSpec("Q")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
T_co = TypeVar("T_co", covariant=True)
S = TypeVar("S")
T = TypeVar("T")


class HookableCallable(Protocol[P, R_co]):
    """What ``@hookable`` returns, as type checkers see it: the function's own
    signature (``P``, ``R_co``), bound like a method when it is one, with the
    registration verbs and ``__wrapped__``."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    @property
    def __wrapped__(self) -> Callable[P, R_co]: ...

    def before(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle: ...

    def after(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle: ...

    def around(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle: ...

    def on_error(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle: ...

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None, /) -> Self: ...
    @overload
    def __get__(self: HookableCallable[Concatenate[S, Q], R], obj: S,
                owner: type[Any] | None = None, /) -> Callable[Q, R]: ...


class HookableClassCallable(HookableCallable[Concatenate[type[T_co], P], R_co], Protocol[T_co, P, R_co]):
    """``@hookable`` over ``@classmethod`` (mypy hands the decorator the function,
    whose first parameter is the class): bound to the class however it is reached."""

    def __get__(self, obj: Any, owner: type[Any] | None = None, /) -> Callable[P, R_co]: ...  # type: ignore[override]


class _HookableDecorator(Protocol):
    """``@hookable("loss")``: the decorator it returns."""

    @overload
    def __call__(self, fn: classmethod[T, P, R], /) -> classmethod[T, P, R]: ...
    @overload
    def __call__(self, fn: staticmethod[P, R], /) -> staticmethod[P, R]: ...  # type: ignore[overload-overlap]
    @overload
    def __call__(self, fn: Callable[Concatenate[type[T], P], R], /) -> HookableClassCallable[T, P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> HookableCallable[P, R]: ...



def _registration_verbs(jp: Any) -> dict[str, Callable[..., Handle]]:
    """``fn.before(cb)`` and friends, for a join point used as a function.

    On a plain function they register on that function; on a method they register
    on its class (all instances and subclasses)."""

    def target() -> Any:
        return jp.owner if jp.owner is not None else jp

    def verb(phase: str, doc: str) -> Callable[..., Handle]:
        def register_callback(fn: Any = None, /, **options: Any) -> Handle:
            return register(target(), phase, jp.event, fn, options)

        register_callback.__doc__ = doc
        return register_callback

    return {
        "before": verb("pre", "Run a callback before this join point (pre-<event>)."),
        "after": verb("post", "Run a callback after this join point (post-<event>)."),
        "around": verb("around", "Wrap this join point: fn(self, proceed, *args, **kwargs)."),
        "on_error": verb("error", "Observe an exception raised by this join point."),
    }


class HookableWrapper(wrapt.FunctionWrapper[..., Any]):
    """A join point around a callable that is not a plain function."""

    def __init__(self, wrapped: Any, join_point: Any) -> None:
        if join_point.binding == CLASSMETHOD:
            def dispatch(_wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                return join_point(instance, *args, **kwargs)
        else:
            def dispatch(_wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                return join_point(*args, **kwargs)
        super().__init__(wrapped, dispatch)
        self._self_join_point = track_join_point(join_point)
        self._self_verbs = _registration_verbs(join_point)

    @property
    def __hookwrap_join_point__(self) -> Any:  # how _dispatch.join_point_of finds it
        return self._self_join_point

    def __set_name__(self, owner: type, name: str) -> None:
        name_join_point(self, owner, name)

    def before(self, fn: Any = None, /, **options: Any) -> Handle:
        """Run a callback before this join point (pre-<event>)."""
        return self._self_verbs["before"](fn, **options)

    def after(self, fn: Any = None, /, **options: Any) -> Handle:
        """Run a callback after this join point (post-<event>)."""
        return self._self_verbs["after"](fn, **options)

    def around(self, fn: Any = None, /, **options: Any) -> Handle:
        """Wrap this join point: fn(self, proceed, *args, **kwargs)."""
        return self._self_verbs["around"](fn, **options)

    def on_error(self, fn: Any = None, /, **options: Any) -> Handle:
        """Observe an exception raised by this join point."""
        return self._self_verbs["on_error"](fn, **options)

    def __reduce_ex__(self, protocol: SupportsIndex) -> str:
        # wrapt refuses to pickle proxies; a module-level join point pickles by name.
        return str(self.__qualname__)


@overload
def hookable(fn: classmethod[T, P, R], /) -> classmethod[T, P, R]: ...
@overload
def hookable(fn: staticmethod[P, R], /) -> staticmethod[P, R]: ...  # type: ignore[overload-overlap]
@overload
def hookable(fn: Callable[Concatenate[type[T], P], R], /) -> HookableClassCallable[T, P, R]: ...
@overload
def hookable(fn: Callable[P, R], /) -> HookableCallable[P, R]: ...
@overload
def hookable(event: str | None = None, /) -> _HookableDecorator: ...


def hookable(fn: Any = None, /) -> Any:
    """Make ``fn`` a join point ``X`` with events ``pre-X``, ``post-X``, ``around-X``
    and ``error-X``.

    ``@hookable`` names the event after the attribute the function is bound to in
    its class (else its ``__name__``); ``@hookable("loss")`` names it explicitly.
    The decorated callable keeps its name, docstring, signature and ``__wrapped__``.
    """
    if fn is None or isinstance(fn, str):
        event = fn
        return lambda f: make_join_point(f, event)
    return make_join_point(fn, None)


def _function_join_point(fn: FunctionType, event: str | None, binding: int) -> Any:
    """A join point for a plain function, as the object to store (see as_attribute)."""
    jp = track_join_point(JoinPoint(fn, event, binding, PLANNER))
    mark = vars(jp).get(JOIN_POINT_ATTR)  # the pure twin's own; not one fn's __dict__ carries
    functools.update_wrapper(jp, fn)
    if mark is not None:
        vars(jp)[JOIN_POINT_ATTR] = mark
    else:
        vars(jp).pop(JOIN_POINT_ATTR, None)  # copied from a wrapper of another join point
    vars(jp).update(_registration_verbs(jp))
    stored = as_attribute(jp)
    if jp.is_async:
        _mark_coroutine_function(jp, stored, fn)
    return stored


def _mark_coroutine_function(jp: Any, stored: Any, fn: FunctionType) -> None:
    """Make ``inspect.iscoroutinefunction`` (and asyncio's) True for the join point
    of ``async def fn``, as for ``fn``, in both twins and bound to an instance."""
    mark = getattr(inspect, "markcoroutinefunction", None)
    if mark is not None:  # 3.12+: a mark in its __dict__ (the pure twin's shares it)
        mark(jp)
    else:
        # 3.11 reads the code flags of a function or of a function-like object,
        # which the join point becomes with these (stored as itself in both twins:
        # _fast_py._ASYNC_STORED_AS_ITSELF).
        vars(jp).update(__code__=fn.__code__, __defaults__=fn.__defaults__,
                        __kwdefaults__=fn.__kwdefaults__)


def make_join_point(fn: Any, event: str | None) -> Any:
    """The join point for ``fn``: a JoinPoint for functions, a wrapt wrapper otherwise."""
    phase, dash, _ = (event or "").partition("-")
    if event is not None and (not event or event.startswith("-") or (dash and phase in PHASES)):
        raise HookError(
            f"@hookable({safe_repr(event)}): give the join point name, like 'loss'; its events "
            f"(pre-loss, post-loss, ...) are named after it."
        )
    existing = join_point_of(fn)
    if existing is not None:
        if event is not None and event != existing.event:
            raise HookError(
                f"{existing.event!r} is already a join point; it cannot also be {event!r}. "
                f"Apply @hookable once."
            )
        return fn
    if isinstance(fn, FunctionType):
        return _function_join_point(fn, event, FUNCTION)
    # A classmethod/staticmethod stays one, around a compiled join point: their own
    # __get__ binds cheaply (wrapt's binding of a classmethod costs ~1 us a call).
    if isinstance(fn, classmethod) and isinstance(fn.__func__, FunctionType):
        return classmethod(_function_join_point(fn.__func__, event, CLASSMETHOD))
    if isinstance(fn, staticmethod) and isinstance(fn.__func__, FunctionType):
        return staticmethod(_function_join_point(fn.__func__, event, FUNCTION))
    if isinstance(fn, (classmethod, staticmethod)):
        binding = CLASSMETHOD if isinstance(fn, classmethod) else FUNCTION
        return HookableWrapper(fn, JoinPoint(fn.__func__, event, binding, PLANNER))
    if callable(fn):
        return HookableWrapper(fn, JoinPoint(fn, event, FUNCTION, PLANNER))
    raise HookError(
        f"@hookable needs a function or method, got {safe_repr(fn)} ({type(fn).__name__}). "
        f"Put @hookable directly above a `def`."
    )
