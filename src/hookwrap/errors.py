"""The errors hookwrap raises. All derive from ``HookError``."""

from __future__ import annotations

import difflib
import pickle
from collections.abc import Iterable
from typing import Any

from ._policy import ERROR, POST, VAR_KW, VAR_POS

__all__ = [
    "CallbackPicklingError",
    "CallbackReturnError",
    "CallbackSignatureError",
    "HookError",
    "HookwrapWarning",
    "StopTraining",
    "UnknownEventError",
    "closest",
    "safe_repr",
]


class HookError(Exception):
    """Base of every error hookwrap raises about how hooks are used."""


class CallbackSignatureError(HookError, TypeError):
    """A callback asks for arguments the join point cannot give it."""


class CallbackReturnError(HookError, TypeError):
    """A callback broke the return contract (it must return what it consumes)."""


class UnknownEventError(HookError, LookupError):
    """An event name that matches no join point."""


class CallbackPicklingError(HookError, pickle.PicklingError):
    """An object is pickled (``torch.save``) with a callback pickle cannot save."""


class HookwrapWarning(UserWarning):
    """Something hookwrap was asked to do could not be done where raising would break
    the user's code (a dotted weave target that did not resolve on import)."""


class StopTraining(Exception):
    """Ends a training run early: raised by a callback (``EarlyStopping``), caught by
    the loop (``except hookwrap.StopTraining``). Control flow, not a failure: error
    callbacks (``on_error``) do not run for it."""


def closest(name: str, candidates: Iterable[str]) -> str:
    """A 'did you mean' fragment for error messages (empty when nothing is close)."""
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.5)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(repr(m) for m in matches) + "?"


# Messages raised from the dispatch path. They are built only once a rule is
# broken, so formatting never costs anything on a call that goes well. `step`
# and `ref` are a dispatch Step / ArgRef (either implementation).



def callback_note(label: str, event: str) -> str:
    return f"hookwrap: raised in callback {label} during event {event!r}"


def add_note_once(exc: BaseException, note: str) -> None:
    """Add ``note`` to ``exc`` unless it already carries it: an exception object
    raised again (a callback re-raising a stored one, call after call) gains it once."""
    notes = getattr(exc, "__notes__", None)
    if notes is None or note not in notes:
        exc.add_note(note)


def note_callback(exc: BaseException, label: str, event: str) -> None:
    """Note on ``exc`` that callback ``label`` raised it during ``event`` (once)."""
    add_note_once(exc, callback_note(label, event))


def missing_argument(step: Any, ref: Any) -> TypeError:
    return TypeError(
        f"callback {step.label} asks for argument {ref.name!r} of event {step.event!r}, "
        f"but the call did not pass it and it has no default."
    )


def check_var_value(step: Any, ref: Any, value: Any) -> None:
    """A replacement for ``*args``/``**kwargs`` must keep its container type."""
    if ref.kind == VAR_POS and not isinstance(value, (tuple, list)):
        raise CallbackReturnError(
            f"callback {step.label} for event {step.event!r} returned a "
            f"{type(value).__name__} for *{ref.name}; return a tuple of positional arguments."
        )
    if ref.kind == VAR_KW:
        if not isinstance(value, dict):
            raise CallbackReturnError(
                f"callback {step.label} for event {step.event!r} returned a "
                f"{type(value).__name__} for **{ref.name}; return a dict of keyword arguments."
            )
        for key in value:
            if not isinstance(key, str):
                raise CallbackReturnError(
                    f"callback {step.label} for event {step.event!r} returned a dict for "
                    f"**{ref.name} with the key {safe_repr(key)}; keyword arguments are named by strings."
                )
            if key in ref.extra:  # a named parameter: it has its own argument
                raise CallbackReturnError(
                    f"callback {step.label} for event {step.event!r} returned a dict for "
                    f"**{ref.name} with the key {key!r}, a parameter of its own; ask for {key!r} "
                    f"and return its replacement instead."
                )




def return_error(step: Any, raw: Any, names: tuple[str, ...]) -> CallbackReturnError:
    got = "None" if raw is None else f"a {type(raw).__name__} ({_short_repr(raw)})"
    if step.phase == ERROR:
        return CallbackReturnError(
            f"error callback {step.label} for event {step.event!r} returned {got}, but error "
            f"callbacks observe: they return None and the exception propagates. To recover "
            f"from the error, use around advice (obj.around) instead."
        )
    read = [ref.name for ref in getattr(step, "refs", ()) if ref.name != "return_value"]
    if not names and step.phase == POST and read:
        want = (f"None: a post callback reads the arguments ({', '.join(map(repr, read))}) but "
                f"cannot replace them, the call is over")
        fix = "drop the return value, or take return_value to replace the result"
    elif not names:
        want = "None, since it takes no arguments and so consumes nothing"
        fix = "drop the return value, or take the argument you mean to replace"
    elif len(names) == 1:
        want = f"the value of {names[0]!r} (or a replacement)"
        fix = f"end the callback with `return {names[0]}`"
    else:
        want = f"a tuple of {len(names)} values ({', '.join(names)})"
        fix = f"end the callback with `return {', '.join(names)}`"
    return CallbackReturnError(
        f"callback {step.label} for event {step.event!r} returned {got}, "
        f"but it must return {want}: a callback returns what it takes. Fix: {fix}."
    )


def emit_return_error(label: str, name: str, result: Any) -> CallbackReturnError:
    return CallbackReturnError(
        f"callback {label} for custom event {name!r} returned {type(result).__name__}; "
        f"custom event callbacks observe and return None."
    )


def safe_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for an error message about a value the user passed: shortened,
    and never raising (an object whose ``__repr__`` raises must not hide the error
    being reported)."""
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - any error of a user's __repr__
        return f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not hide the error being reported
        return f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


# What a proceed() knows of its own use (the dispatch modules keep it per proceed).
PROCEED_FRESH, PROCEED_CALLED, PROCEED_ENDED = 0, 1, 2


def proceed_twice(step: Any, state: int = PROCEED_CALLED) -> HookError:
    """A proceed() called when it may not be: a second time (``PROCEED_CALLED``), or
    after the advised call it was made for has ended (``PROCEED_ENDED``)."""
    if state == PROCEED_ENDED:
        join_point = str(step.event).removeprefix("around-")
        return HookError(
            f"around callback {step.label} for event {step.event!r} kept its proceed() and it "
            f"was called after that call of join point {join_point!r} had ended: proceed is "
            f"only valid inside the advice's own call, before the advice returns. To run the "
            f"join point again, call it (its callbacks and advice run again)."
        )
    return HookError(
        f"around callback {step.label} for event {step.event!r} called proceed() a second "
        f"time; call it at most once (to retry, loop inside a single call of the join point)."
    )


def proceed_not_awaited(step: Any) -> HookError:
    return HookError(
        f"async around callback {step.label} for event {step.event!r} called proceed() "
        f"without awaiting it, so the join point did not run. Fix: `return await proceed(...)` "
        f"(proceed() of an async join point returns a coroutine)."
    )
