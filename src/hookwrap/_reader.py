"""A reader: one value of a join point's event handed to a method of a callback
object, with a signature naming that value, so the registration plans it like a
function asking for it. The shipped callbacks (hookwrap.torch) attach through it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

__all__ = ["reader"]

_P = inspect.Parameter


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
    made = functools.partial(function, handler, extra) if extra else functools.partial(function, handler)
    owner = handler.__self__  # type: ignore[attr-defined]
    # Named by the concrete class (describe shows "EarlyStopping.observe").
    name_shown = f"{type(owner).__name__}.{handler.__name__}" + (f"[{','.join(map(str, extra))}]" if extra else "")
    params = [_P("self", _P.POSITIONAL_OR_KEYWORD)]
    if name is not None:
        params.append(_P(name, _P.POSITIONAL_OR_KEYWORD))
    vars(made).update(__self__=owner,  # its callback: ordering refs, callback_state
                      __qualname__=name_shown, __name__=name_shown, __signature__=inspect.Signature(params))
    return made
