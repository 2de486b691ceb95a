"""The tiers: which callbacks one event has for one object, in the order they run,
each with a structured ``Source`` that ``describe`` prints.

Tiers, in order (Cerebras: core -> user -> global):

1. class tier (core): for each class of the MRO from base to most derived, its
   declared ``callbacks`` list, then its ``{phase}_<event>_callback`` methods;
   after all of those, run-time class registrations (``hw.before(Cls, ...)``),
   base class first;
2. user tier: ``obj.callbacks`` of the instance (``obj.before``, ``add_callback``
   append to it), or for a plain function its own registrations;
3. global tier: ``register_global_callback``.

Within a tier: registration order, ``prepend=True`` first, then ``before=`` /
``after=`` constraints (``options.order_entries``).
"""

from __future__ import annotations

from types import FunctionType
from typing import Any, Iterable, NamedTuple

from ._checks import check_custom_callback, check_event, planned_step
from ._joinpoints import spec_of
from ._owners import GLOBAL, class_record
from .errors import HookError
from ._events import CUSTOM, callback_method_event
from ._options import Registration, order_entries
# An instance's record and its list were defined here: objects pickled then name them
# hookwrap._tiers.InstanceRecord (InstanceHooks in 0.1.0) and InstanceCallbackList.
from ._instances import InstanceCallbackList, InstanceRecord, InstanceRecord as InstanceHooks  # noqa: F401

__all__ = [
    "Entry",
    "Source",
    "check_class_tier",
    "class_entries",
    "entries_for",
]


class Source(NamedTuple):
    """Where an entry came from. ``tier``: class, instance, function or global;
    ``kind`` (class tier): list (its ``callbacks``), method (a ``*_callback``
    method) or registered (``hw.before(Cls, ...)``); ``owner``: the class;
    ``attr``: the method's name."""

    tier: str
    kind: str = ""
    owner: str = ""
    attr: str = ""

    def __str__(self) -> str:
        if self.kind == "list":
            return f"class list {self.owner}.callbacks"
        if self.kind == "method":
            return f"class method {self.attr} ({self.owner})"
        if self.kind == "registered":
            return f"class {self.owner} (registered)"
        return self.tier


INSTANCE = Source("instance")
FUNCTION_TIER = Source("function")
GLOBAL_TIER = Source("global")


class Entry(NamedTuple):
    """One callback of one event, with where it came from."""

    phase: str  # "pre", "post", "around", "error" or "on" (custom event)
    event: str  # normalized join point name, or the custom event name
    fn: Any
    options: Any
    source: Source
    registration: Registration

    @property
    def origin(self) -> str:
        return str(self.source)


def _entry(registration: Registration, source: Source) -> Entry:
    return Entry(registration.phase, registration.name, registration.fn, registration.options,
                 source, registration)


# --- the class tier ------------------------------------------------------------


def _own_entries(klass: type, record: Any) -> tuple[list[Entry] | None, list[tuple[str, Entry | None]]]:
    """``klass``'s class-body entries: its declared list (None: ``callbacks = None``
    drops the inherited ones) and its callback methods (None: ``pre_step_callback =
    None`` drops the inherited one). Read once, kept in its record."""
    record.refuse_late_changes()
    if record.own_entries is not None:
        return record.own_entries  # type: ignore[no-any-return]
    declared: list[Entry] | None = None
    if record.declared is not None:
        source = Source("class", "list", klass.__qualname__)
        declared = [_entry(r, source) for r in record.declared]
    methods: list[tuple[str, Entry | None]] = []
    for attr, value in list(vars(klass).items()):
        parsed = callback_method_event(attr)
        if parsed is None:
            continue
        if value is None:
            methods.append((attr, None))
            continue
        if not isinstance(value, FunctionType):
            raise HookError(
                f"{klass.__qualname__}.{attr} looks like a callback method but is a "
                f"{type(value).__name__}; define it as a plain method `def {attr}(self, ...)`."
            )
        phase, name = parsed
        registration = Registration(f"{phase}-{name}", value, None, parsed)
        methods.append((attr, _entry(registration, Source("class", "method", klass.__qualname__, attr))))
    record.own_entries = (declared, methods)
    return record.own_entries  # type: ignore[no-any-return]


def class_entries(tp: type) -> list[Entry]:
    """The class tier of ``tp``: declared (base first), then run-time registrations."""
    entries: list[Entry] = []
    records = [class_record(klass, create=False) for klass in reversed(tp.__mro__)]
    for klass, record in zip(reversed(tp.__mro__), records):
        if record is None or not record.prepared:
            continue
        declared, methods = _own_entries(klass, record)
        if declared is None:
            entries = [e for e in entries if e.source.kind != "list"]
        else:
            entries += declared
        for attr, entry in methods:
            if entry is None:
                entries = [e for e in entries if not (e.source.kind == "method" and e.source.attr == attr)]
            else:
                entries.append(entry)
    for klass, record in zip(reversed(tp.__mro__), records):
        if record is not None and record.registrations:
            source = Source("class", "registered", klass.__qualname__)
            entries += [_entry(r, source) for r in record.registrations]
    return entries


def check_class_tier(cls: type) -> None:
    """Check every class-tier callback of ``cls``: its event exists, its signature fits."""
    for entry in class_entries(cls):
        where = f"{cls.__qualname__} ({entry.origin})"
        jp = check_event(cls, entry.phase, entry.event, where)
        if jp is None:
            check_custom_callback(entry.fn, where, pass_obj=True)
        else:
            planned_step(entry.registration, spec_of(jp))


# --- all tiers of one event ------------------------------------------------------


def _ordered(entries: list[Entry]) -> list[Entry]:
    """Apply prepend/before/after within one tier, per phase."""
    if not any(e.options is not None for e in entries):
        return entries
    out: list[Entry] = []
    for phase in dict.fromkeys(e.phase for e in entries):
        out += order_entries([e for e in entries if e.phase == phase], lambda e: e.fn)
    return out


def entries_for(event: str, custom: bool, tp: Any, jp: Any, state: Any) -> list[Entry]:
    """Every entry of ``event`` (a custom event if ``custom``) for one object, class or
    function, tier by tier, in order."""
    def pick_entries(entries: Iterable[Entry]) -> list[Entry]:
        return _ordered([e for e in entries if e.event == event and (e.phase == CUSTOM) == custom])

    def pick(registrations: Iterable[Registration], source: Source) -> list[Entry]:
        return pick_entries(_entry(r, source) for r in registrations)

    core = pick_entries(class_entries(tp)) if isinstance(tp, type) else []
    user: list[Entry] = []
    if jp is not None and jp.record is not None:
        user += pick(jp.record.registrations, FUNCTION_TIER)
    if state is not None:
        user += pick(state.callbacks, INSTANCE)
    return core + user + pick(GLOBAL.registrations, GLOBAL_TIER)
