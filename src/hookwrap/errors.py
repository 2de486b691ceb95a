"""The errors hookwrap raises (all derive from ``HookError``, but ``StopTraining``),
and what every message uses (``closest``, ``safe_repr``, the note naming the
callback that raised). The messages of a broken call rule are ``_rules``'."""

from __future__ import annotations

import difflib
import pickle
from collections.abc import Iterable
from typing import Any

__all__ = [
    "CallbackPicklingError",
    "CallbackReturnError",
    "CallbackSignatureError",
    "HookError",
    "HookwrapWarning",
    "SettingError",
    "StopTraining",
    "UnknownEventError",
    "closest",
    "safe_repr",
]


class HookError(Exception):
    """Base of every error hookwrap raises about how hooks are used."""


class SettingError(HookError, ValueError):
    """A callback's setting (a keyword of its constructor) that can never work, or a
    value it was given that it cannot take: ``except ValueError`` catches it too."""


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


def safe_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for an error message about a value the user passed: shortened,
    and never raising (an object whose ``__repr__`` raises must not hide the error
    being reported)."""
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - any error of a user's __repr__
        return f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."
