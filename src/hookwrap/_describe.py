"""``hw.describe(target, event=None)``: the effective, ordered chain of each event,
with where each callback came from."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ._entries import CUSTOM, PHASES, normalize
from ._joinpoints import (
    callable_label,
    declared_custom_events,
    find_join_point,
    fitting_step,
    join_point_of,
    join_points,
    spec_of,
)
from ._registry import GLOBAL_TIER, Entry, can_hold_state, entries_for, instance_state
from .errors import HookError, UnknownEventError

__all__ = ["Description", "describe"]


class Description:
    """Printable; ``chains`` maps each join point (``"step"``: all its phases), event
    (``"pre-step"``) or custom event to its ordered entries."""

    def __init__(self, title: str, chains: dict[str, list[Entry]]) -> None:
        self.title = title
        self.chains = chains

    def __str__(self) -> str:
        lines = [self.title]
        for name, entries in self.chains.items():
            lines.append(f"  {name}")
            if not entries:
                lines.append("    (no callbacks)")
            point = _split(name)[1]
            for i, e in enumerate(entries, 1):
                event = e.event if e.phase == CUSTOM else f"{e.phase}-{point}"
                opts = ""
                if e.options is not None and e.options.gate is not None:
                    opts = f" [{e.options.gate!r}]"
                lines.append(f"    {i}. {event:<16} {callable_label(e.fn)}{opts}  <- {e.origin}")
        return "\n".join(lines)

    __repr__ = __str__

    def callback_objects(self) -> list[Any]:
        """The callback objects behind the entries (a ``Callback``'s bound methods and
        readers), each once, in chain order."""
        found: dict[int, Any] = {}
        for entries in self.chains.values():
            for entry in entries:
                owner = getattr(entry.fn, "__self__", None)
                if owner is not None:
                    found.setdefault(id(owner), owner)
        return list(found.values())


def _split(event: str) -> tuple[str | None, str]:
    """``"pre-step"`` -> ``("pre", "step")``; ``"step"`` -> ``(None, "step")``."""
    phase, dash, name = event.partition("-")
    if dash and phase in PHASES and name:
        return phase, name
    return None, event


def _phase_order(entries: list[Entry], phase: str | None) -> list[Entry]:
    if phase is not None:
        return [e for e in entries if e.phase == phase]
    rank = {p: i for i, p in enumerate(PHASES)}
    return sorted(entries, key=lambda e: rank.get(e.phase, len(rank)))  # stable


def _running(entries: list[Entry], jp: Any) -> list[Entry]:
    """Without the global callbacks that do not fit this join point (they skip it)."""
    spec = spec_of(jp)
    return [e for e in entries if e.source is not GLOBAL_TIER or fitting_step(e.registration, spec) is not None]


def describe(target: Any, event: str | None = None) -> Description:
    """The callbacks that will run, in order, for each event of ``target`` (an instance,
    a class, or a hookable function), each with its origin. ``event`` narrows it to
    one join point (``"step"``: all its phases), one event (``"pre-step"``) or one
    custom event."""
    if event is not None and not isinstance(event, str):
        raise HookError(f"describe: the event must be a string like 'step' or 'pre-step', "
                        f"got {type(event).__name__}.")
    if event is not None:
        event = str.__str__(event)  # a str subclass's own __hash__/__eq__ never run
    phase, name = _split(event) if event is not None else (None, "")
    jp = join_point_of(target)
    if jp is not None and jp.owner is None:
        if event is not None and normalize(name) != normalize(jp.event):
            raise UnknownEventError(
                f"describe({jp.event}): it has no event {event!r}; its events are "
                + ", ".join(f"'{p}-{jp.event}'" for p in PHASES) + "."
            )
        entries = _running(entries_for(normalize(jp.event), False, None, jp, None), jp)
        return Description(f"join point {jp.event!r}", {event or jp.event: _phase_order(entries, phase)})
    if isinstance(target, ModuleType):
        raise HookError(f"describe({target.__name__}): describe a hookable function or an object.")
    tp = target if isinstance(target, type) else type(target)
    state = None if isinstance(target, type) or not can_hold_state(target) \
        else instance_state(target, create=False)
    points = join_points(tp)
    if event is not None:
        if phase is None and event in declared_custom_events(tp):
            customs, points = [event], {}
        else:
            found = find_join_point(tp, name, f"describe({tp.__qualname__})")
            customs, points = [], {normalize(found.event): found}
    else:
        customs = sorted(declared_custom_events(tp))
    chains: dict[str, list[Entry]] = {}
    for key, point in sorted(points.items()):
        entries = _running(entries_for(key, False, tp, point, state), point)
        label = f"{phase}-{point.event}" if phase is not None else point.event
        chains[label] = _phase_order(entries, phase)
    for custom in customs:
        chains[custom] = entries_for(custom, True, tp, None, state)
    kind = "class" if isinstance(target, type) else "instance"
    return Description(f"{tp.__qualname__} ({kind})", chains)
