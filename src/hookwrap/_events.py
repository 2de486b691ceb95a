"""Event names.

A join point ``X`` has the events ``pre-X``, ``post-X``, ``around-X`` and
``error-X``. The phase is the exact prefix before the first ``-``, never a
substring test (ArcticTraining treats ``post-predict`` as a pre event because
``"pre" in`` it). Any other identifier, such as ``on_validation_end``, names a
custom event, fired with ``emit`` and declared in the class's ``emits``.
"""

from __future__ import annotations

import re
from typing import Iterable

from .errors import UnknownEventError, closest, safe_repr

__all__ = [
    "CUSTOM",
    "PHASES",
    "callback_method_event",
    "callback_object_event",
    "normalize",
    "parse_event",
]

PHASES = ("pre", "post", "around", "error")
CUSTOM = "on"  # the phase of a custom event

_CLASS_METHOD = re.compile(r"^(pre|post|around|error)_(.+)_callback$")
_OBJECT_METHOD = re.compile(r"^(pre|post|around|error)_(.+)$")


def normalize(name: str) -> str:
    """Join point names compare with ``-`` and ``_`` treated alike."""
    return name.replace("-", "_")


def parse_event(event: object, where: str, known: Iterable[str] = ()) -> tuple[str, str]:
    """``"pre-step"`` -> ``("pre", "step")``; ``"on_fit_end"`` -> ``("on", "on_fit_end")``.

    ``known`` (event strings) feeds the 'did you mean' of the error.
    """
    if not isinstance(event, str):
        raise UnknownEventError(
            f"{where}: an event must be a string like 'pre-step', 'post-step' or a custom "
            f"event name, got {safe_repr(event)} ({type(event).__name__})."
        )
    phase, sep, name = event.partition("-")
    if sep and phase in PHASES and name:
        return phase, name
    if not sep and event.isidentifier():
        return CUSTOM, event
    raise UnknownEventError(
        f"{where}: {safe_repr(event)} is not an event name. Events are '<phase>-<join point>' with a "
        f"phase of {', '.join(PHASES)} (e.g. 'pre-step'), or a custom event name."
        + closest(event, known)
    )


def callback_method_event(attr: str) -> tuple[str, str] | None:
    """A class-tier method name: ``"pre_step_callback"`` -> ``("pre", "step")``."""
    m = _CLASS_METHOD.match(attr)
    return (m.group(1), m.group(2)) if m else None


def callback_object_event(attr: str) -> tuple[str, str] | None:
    """A ``Callback`` method name: ``"pre_loss"`` -> ``("pre", "loss")``,
    ``"on_fit_end"`` -> ``("on", "on_fit_end")``; ``None`` if it names no event."""
    if attr.startswith("on_"):
        return CUSTOM, attr
    m = _OBJECT_METHOD.match(attr)
    return (m.group(1), m.group(2)) if m else None
