"""The registration verbs, for any target: an instance, a class (all its
instances and subclasses), a module or a hookable function."""

from __future__ import annotations

from typing import Any, Callable

from ._events import CUSTOM
from ._registration import Handle, register

__all__ = ["after", "around", "before", "on", "on_error"]


def before(target: Any, event: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
    """Run ``fn`` before join point ``event`` of ``target`` (event ``pre-<event>``)."""
    return register(target, "pre", event, fn, options)


def after(target: Any, event: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
    """Run ``fn`` after join point ``event`` of ``target`` (event ``post-<event>``)."""
    return register(target, "post", event, fn, options)


def around(target: Any, event: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
    """Wrap join point ``event``: ``fn(self, proceed, *args, **kwargs)`` calls
    ``proceed(*args, **kwargs)`` at most once and returns the result."""
    return register(target, "around", event, fn, options)


def on_error(target: Any, event: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
    """Observe an exception raised by join point ``event`` or its callbacks (event
    ``error-<event>``); the exception propagates afterwards."""
    return register(target, "error", event, fn, options)


def on(target: Any, name: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
    """Run ``fn`` when ``target`` emits custom event ``name``."""
    return register(target, CUSTOM, name, fn, options)
