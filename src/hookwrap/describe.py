"""``hw.describe(target, event=None)``: the effective, ordered chain of each event,
with where each callback came from."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .errors import HookError
from .events import CUSTOM, PHASES, normalize
from .registry import (
    Entry,
    as_join_point,
    declared_custom_events,
    entries_for,
    find_join_point,
    instance_state,
    join_points,
)
from .signature import callable_label

__all__ = ["Description", "describe"]


class Description:
    """Printable; ``chains`` maps each event name to its ordered entries."""

    def __init__(self, title: str, chains: dict[str, list[Entry]]) -> None:
        self.title = title
        self.chains = chains

    def __str__(self) -> str:
        lines = [self.title]
        for name, entries in self.chains.items():
            lines.append(f"  {name}")
            if not entries:
                lines.append("    (no callbacks)")
            for i, e in enumerate(entries, 1):
                event = e.event if e.phase == CUSTOM else f"{e.phase}-{name}"
                opts = ""
                if e.options is not None and e.options.gate is not None:
                    opts = f" [{e.options.gate!r}]"
                lines.append(f"    {i}. {event:<16} {callable_label(e.fn)}{opts}  <- {e.origin}")
        return "\n".join(lines)

    __repr__ = __str__


def _phase_order(entries: list[Entry]) -> list[Entry]:
    rank = {p: i for i, p in enumerate(PHASES)}
    return sorted(entries, key=lambda e: rank.get(e.phase, len(rank)))  # stable


def describe(target: Any, event: str | None = None) -> Description:
    """The callbacks that will run, in order, for each event of ``target`` (an instance,
    a class, or a hookable function), each with its origin."""
    jp = as_join_point(target)
    if jp is not None and jp.owner is None:
        entries = entries_for(normalize(jp.event), lambda p: p != CUSTOM, None, jp, None)
        return Description(f"join point {jp.event!r}", {jp.event: _phase_order(entries)})
    if isinstance(target, ModuleType):
        raise HookError(f"describe({target.__name__}): describe a hookable function or an object.")
    tp = target if isinstance(target, type) else type(target)
    state = None if isinstance(target, type) else instance_state(target, create=False)
    points = join_points(tp)
    if event is not None:
        if event in declared_custom_events(tp):
            customs, points = [event], {}
        else:
            found = find_join_point(tp, event, f"describe({tp.__qualname__})")
            customs, points = [], {normalize(found.event): found}
    else:
        customs = sorted(declared_custom_events(tp))
    chains: dict[str, list[Entry]] = {}
    for key, point in sorted(points.items()):
        entries = entries_for(key, lambda p: p != CUSTOM, tp, point, state)
        chains[point.event] = _phase_order(entries)
    for name in customs:
        chains[name] = entries_for(name, lambda p: p == CUSTOM, tp, None, state)
    kind = "class" if isinstance(target, type) else "instance"
    return Description(f"{tp.__qualname__} ({kind})", chains)
