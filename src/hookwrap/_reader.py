"""A reader: one value of a join point's event handed to a method of a callback
object, with a signature naming that value, so the registration plans it like a
function asking for it. The shipped callbacks (hookwrap.torch) attach through it.

A reader fits every kind of join point: on one without an object (a plain or
woven module function, a staticmethod) the registration plans its twin that
takes no ``self`` and hands the callback ``None`` for the object. A callback that
reads different values on different join points (``model`` as an argument on
one, an attribute of the object on another) registers ``per_join_point(...)``,
whose choice is made when each join point plans it, once.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

__all__ = ["for_join_point", "per_join_point", "reader"]

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
