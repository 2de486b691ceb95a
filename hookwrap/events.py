"""Event names: ``pre-X``, ``post-X`` (``around-X``, ``error-X`` later) for a join point ``X``.

The phase is the exact prefix before the first ``-`` -- never a substring test
(ArcticTraining treats ``post-predict`` as a pre event because ``"pre" in`` it).
"""

from __future__ import annotations

import re

from .errors import UnknownEventError, closest

__all__ = ["PHASES", "callback_method_event", "normalize", "split_event"]

PHASES = ("pre", "post")

_METHOD_NAME = re.compile(r"^(pre|post)_(.+)_callback$")


def normalize(name: str) -> str:
    """Join point names compare with ``-`` and ``_`` treated alike."""
    return name.replace("-", "_")


def split_event(event: object, where: str) -> tuple[str, str]:
    """``"pre-step"`` -> ``("pre", "step")``; raises :class:`UnknownEventError` otherwise."""
    if not isinstance(event, str):
        raise UnknownEventError(
            f"{where}: an event must be a string like 'pre-step' or 'post-step', "
            f"got {event!r} ({type(event).__name__})."
        )
    phase, sep, name = event.partition("-")
    if not sep or phase not in PHASES or not name:
        rest = name if sep else event
        for prefix in PHASES:  # "postpredict" / "post_predict" -> "post-predict"
            if not sep and event.startswith(prefix):
                rest = event[len(prefix):].lstrip("_")
        raise UnknownEventError(
            f"{where}: {event!r} is not an event name. Events are "
            f"'pre-<join point>' or 'post-<join point>', e.g. 'pre-step'."
            + closest(event, [f"{p}-{rest}" for p in PHASES])
        )
    return phase, name


def callback_method_event(attr: str) -> tuple[str, str] | None:
    """``"pre_step_callback"`` -> ``("pre", "step")``; ``None`` for other names."""
    m = _METHOD_NAME.match(attr)
    return (m.group(1), m.group(2)) if m else None
