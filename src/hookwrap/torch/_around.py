"""Around advice from a shipped callback, on method and function join points alike."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import HookError
from ..extend import JoinPointInfo

__all__ = ["around_advice"]


def around_advice(jps: list[JoinPointInfo], where: str, method: Callable[..., Any],
                  function: Callable[..., Any]) -> Callable[..., Any]:
    """The around advice to register on these join points: ``method(obj, proceed,
    *args, **kwargs)`` on methods, ``function(proceed, *args, **kwargs)`` on
    functions. A global callback reaching both kinds is refused."""
    kinds = {jp.has_object for jp in jps}
    if len(kinds) > 1:
        raise HookError(f"{where}: {jps[0].event!r} is a method in some places and a function in others; "
                        f"attach the callback to one object or function instead of globally.")
    return method if kinds == {True} else function
