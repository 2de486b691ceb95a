"""``@hookable``: make a function or method a join point.

Plain functions (``def``/``async def``, in a class body or not) become a compiled
``JoinPoint``: a descriptor that binds like a function (vectorcall, no bound
object built per attribute lookup) and dispatches the callbacks of its event.
Every other kind of callable -- classmethod, staticmethod, a callable object,
a builtin -- is wrapped in a ``wrapt.FunctionWrapper``, which gets binding
right for each of them, around the same ``JoinPoint``.
"""

from __future__ import annotations

import functools
from types import FunctionType
from typing import Any, Callable, TypeVar, overload

import wrapt

from ._dispatch import CLASSMETHOD, FUNCTION, JoinPoint
from .errors import HookError
from .registry import as_join_point

__all__ = ["HookableWrapper", "hookable"]

F = TypeVar("F", bound=Callable[..., Any])


class HookableWrapper(wrapt.FunctionWrapper):  # type: ignore[misc]
    """A join point around a callable that is not a plain function."""

    _hookwrap_join_point = True

    def __init__(self, wrapped: Any, join_point: Any) -> None:
        if join_point.binding == CLASSMETHOD:
            def dispatch(_wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                return join_point(instance, *args, **kwargs)
        else:
            def dispatch(_wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                return join_point(*args, **kwargs)
        super().__init__(wrapped, dispatch)
        self._self_join_point = join_point

    def __set_name__(self, owner: type, name: str) -> None:
        jp = self._self_join_point
        jp.owner, jp.attr_name = owner, name
        if not jp.explicit_event:
            jp.event = name

    def __reduce_ex__(self, protocol: int) -> str:
        # wrapt refuses to pickle proxies; a module-level join point pickles by name.
        return self.__qualname__  # type: ignore[no-any-return]


@overload
def hookable(fn: F, /) -> F: ...
@overload
def hookable(event: str | None = None, /) -> Callable[[F], F]: ...


def hookable(fn: Any = None, /) -> Any:
    """Make ``fn`` a join point ``X`` with events ``pre-X`` and ``post-X``.

    ``@hookable`` names the event after the attribute the function is bound to in
    its class (else its ``__name__``); ``@hookable("loss")`` names it explicitly.
    The decorated callable keeps its name, docstring, signature and ``__wrapped__``.
    """
    if fn is None or isinstance(fn, str):
        event = fn
        return lambda f: _make_join_point(f, event)
    return _make_join_point(fn, None)


def _make_join_point(fn: Any, event: str | None) -> Any:
    if event is not None and (not event or "-" == event[0]):
        raise HookError(f"@hookable({event!r}): an event name must be a non-empty name like 'loss'.")
    existing = as_join_point(fn)
    if existing is not None:
        if event is not None and event != existing.event:
            raise HookError(
                f"{existing.event!r} is already a join point; it cannot also be {event!r}. "
                f"Apply @hookable once."
            )
        return fn
    if isinstance(fn, FunctionType):
        jp = JoinPoint(fn, event, FUNCTION)
        functools.update_wrapper(jp, fn)
        return jp
    if isinstance(fn, classmethod):
        return HookableWrapper(fn, JoinPoint(fn.__func__, event, CLASSMETHOD))
    if isinstance(fn, staticmethod):
        return HookableWrapper(fn, JoinPoint(fn.__func__, event, FUNCTION))
    if callable(fn):
        return HookableWrapper(fn, JoinPoint(fn, event, FUNCTION))
    raise HookError(
        f"@hookable needs a function or method, got {fn!r} ({type(fn).__name__}). "
        f"Put @hookable directly above a `def`."
    )
