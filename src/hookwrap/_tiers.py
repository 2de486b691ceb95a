"""The tiers: which callbacks one event has for one object, in the order they run,
each with a structured ``Origin`` that ``describe`` prints.

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

The instance tier's owner: an object's own callbacks (``obj.callbacks``) and the
chains built for it, kept in an ``InstanceRecord`` stored on the object. Apart
from the other owners (``_owners``) because users change this one directly
(``obj.callbacks.append``, ``del``, ``[:] =``): its list checks every entry added
that way and invalidates what each change touches itself.
"""

from __future__ import annotations

import copy
from types import FunctionType
from typing import Any, Iterable, NamedTuple, cast

from ._dispatch import HookState
from ._entries import CUSTOM, Options, Registration, callback_method_event, normalize, order_entries
from ._joinpoints import (
    check_custom_callback,
    check_entry,
    check_event,
    pickle_problem,
    planned_step,
    spec_of,
)
from ._owners import (
    GLOBAL,
    changed_class,
    class_record,
    drop_chains,
    drop_emit_events,
    lock,
    position,
    rebuild,
    traced_ones,
)
from ._policy import STATE_KEY
from ._joinpoints import callable_label
from .errors import CallbackPicklingError, HookError

__all__ = [
    "Entry",
    "InstanceCallbackList",
    "InstanceRecord",
    "Origin",
    "can_hold_state",
    "check_class_tier",
    "class_entries",
    "entries_for",
    "instance_state",
]


# --- The instance tier's record --------------------------------------------------

class InstanceCallbackList(list):  # type: ignore[type-arg]
    """``obj.callbacks``: this instance's ``(event, fn)`` entries.

    A list of the object's own; the class's declared list is never touched.
    Every entry is checked when it is added (unknown event, bad signature), and
    every change takes effect at the next call.
    """

    __slots__ = ("_cls", "_state")

    def __init__(self, cls: type, items: Iterable[Any] = (), state: Any = None) -> None:
        super().__init__()
        self._cls = cls
        self._state = state  # the InstanceRecord whose chains a change drops
        self.extend(items)

    def _check(self, item: Any) -> Any:
        return check_entry(self._cls, item, f"{self._cls.__qualname__} instance callbacks")

    def _changed(self, items: Iterable[Any] | None = None, added: bool = False) -> None:
        """Have the record drop what the events of ``items`` (None: every event) built;
        unless the registration ``added`` them (it keeps its ordering graphs in step),
        its ordering graphs too."""
        state = self._state
        if state is not None:
            if not added:
                state.order_cache.clear()
            for event in [None] if items is None else dict.fromkeys(item.name for item in items):
                state.changed(event)

    def append(self, item: Any) -> None:
        item = self._check(item)
        with lock:
            super().append(item)
            self._changed([item])

    def extend(self, items: Iterable[Any]) -> None:
        items = [self._check(item) for item in items]
        with lock:
            super().extend(items)
            self._changed(items)

    def insert(self, index: Any, item: Any) -> None:
        item = self._check(item)
        with lock:
            super().insert(index, item)
            self._changed([item])

    def __iadd__(self, items: Iterable[Any]) -> InstanceCallbackList:  # type: ignore[misc]
        self.extend(items)
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        value = [self._check(v) for v in value] if isinstance(index, slice) else self._check(value)
        with lock:
            super().__setitem__(index, value)
            self._changed()

    def __delitem__(self, index: Any) -> None:
        with lock:
            removed = self[index]
            super().__delitem__(index)
            self._changed(removed if isinstance(index, slice) else [removed])

    def remove(self, item: Any) -> None:
        with lock:
            removed = self[self.index(item)]
            super().remove(item)
            self._changed([removed])

    def pop(self, index: Any = -1) -> Any:
        with lock:
            item = super().pop(index)
            self._changed([item])
            return item

    def clear(self) -> None:
        with lock:
            super().clear()
            self._changed()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        with lock:
            super().sort(*args, **kwargs)
            self._changed()

    def reverse(self) -> None:
        with lock:
            super().reverse()
            self._changed()

    def __imul__(self, n: Any) -> InstanceCallbackList:  # type: ignore[misc]
        with lock:
            super().__imul__(n)
            self._changed()
        return self

    def __reduce__(self) -> Any:
        return (InstanceCallbackList, (self._cls, list(self)))


class InstanceRecord(HookState):
    """What hookwrap keeps about one instance (its own attribute ``STATE_KEY``): the
    instance tier's registrations (``obj.callbacks``) and its chain cache."""

    def __init__(self, cls: type, callbacks: Iterable[Any] = ()) -> None:
        super().__init__()
        self.cls = cls
        # (phase, event) -> options.OrderGraph of obj.callbacks' before=/after=, kept by
        # registration (_registration) while entries are only added by it.
        self.order_cache: dict[Any, Any] = {}
        record = class_record(cls)
        assert record is not None
        with lock:  # from now on, calls on `cls` instances look for instance state
            record.states.add(self)
            if not record.stateful:
                record.stateful = True
                changed_class(cls, None)
        self.callbacks = InstanceCallbackList(cls, callbacks, self)

    @property
    def registrations(self) -> InstanceCallbackList:
        """``obj.callbacks``, as every owner of registrations names them (_owners.Record)."""
        return self.callbacks

    def add(self, entries: list[Registration]) -> None:
        """Store entries the registration has checked (not checked again)."""
        list.extend(self.callbacks, entries)
        self.callbacks._changed(entries, added=True)

    def remove(self, entry: Registration) -> bool:
        i = position(self.callbacks, entry)
        if i is None:
            return False
        del self.callbacks[i]  # the list has this record invalidate
        return True

    def changed(self, event: str | None) -> None:
        """Drop this instance's chains of ``event`` (None: all). Of those, compiled
        code re-traces the ones it traced: built again now, with the first chain of an
        event whose class chain it traced (the instance gained callbacks of its own
        after compiling)."""
        dropped = self.drop(event)
        if self.ready:
            record = class_record(self.cls, create=False)
            first = [(jp, chain) for jp, chain in (record.chains.items() if record else ())
                     if (event is None or normalize(jp.event) == event) and jp not in self.chains]
            rebuild(traced_ones(dropped, self) + traced_ones(first, self))

    @property
    def ready(self) -> bool:
        """Its callbacks list is in place (not while that list is being built)."""
        return "callbacks" in self.__dict__

    def drop(self, event: str | None) -> list[tuple[Any, Any]]:
        """Invalidate and drop this instance's chains of ``event`` (None: all);
        returns them (``_owners.drop_chains``)."""
        dropped = drop_chains(self.chains, event)
        self.forget_last_chain()
        drop_emit_events(self.emit_cache, event)
        return dropped

    def __reduce__(self) -> Any:
        # Pickling (torch.save): each callback must be one pickle can save; say which
        # is not, and how to save without it. The chain caches are rebuilt on load.
        for entry in self.callbacks:
            problem = pickle_problem(entry[1])
            if problem is not None:
                raise CallbackPicklingError(
                    f"cannot pickle this {self.cls.__qualname__}: its callback "
                    f"{callable_label(entry[1])} for event {entry[0]!r} is {problem}, which pickle "
                    f"cannot save. Register a module-level function instead, remove the callback "
                    f"before saving (handle.remove(), or obj.callbacks.clear()), or save the "
                    f"weights alone: torch.save(obj.state_dict(), path)."
                )
        return (InstanceRecord, (self.cls, list(self.callbacks)))

    def __copy__(self) -> InstanceRecord:
        # The same callbacks, each with filters of its own (every/once counters go on
        # from where they are, apart from the original's).
        return InstanceRecord(self.cls, [_with_own_filters(entry) for entry in self.callbacks])

    def __deepcopy__(self, memo: dict[int, Any]) -> InstanceRecord:
        # Copying is not pickling: a lambda callback is copied as it is.
        return InstanceRecord(self.cls, copy.deepcopy(list(self.callbacks), memo))




def _with_own_filters(entry: Any) -> Any:
    options = getattr(entry, "options", None)
    if options is None or options.gate is None:
        return entry
    gate = copy.copy(options.gate)
    return Registration(entry[0], entry[1], Options(options.prepend, options.before, options.after, gate),
                        (entry.phase, entry.name))


def can_hold_state(obj: Any) -> bool:
    """Whether ``obj`` can keep instance callbacks (it has a ``__dict__``)."""
    return bool(type(obj).__dictoffset__) or hasattr(obj, "__dict__")


def instance_state(obj: Any, create: bool = True) -> InstanceRecord | None:
    tp = type(obj)
    if not tp.__dictoffset__ and not hasattr(obj, "__dict__"):
        raise HookError(
            f"{tp.__qualname__} instances have no __dict__ (__slots__?), so they cannot "
            f"hold instance callbacks; register on the class instead: "
            f"hookwrap.before({tp.__name__}, ...)."
        )
    state = _own_state(obj)
    if state is None and create:
        with lock:
            state = _own_state(obj)
            if state is None:
                state = InstanceRecord(tp)
                _store_state(obj, state)
    return cast("InstanceRecord | None", state)


# An object's state is read and stored without asking for its __dict__: on
# CPython 3.11 and 3.12 that moves the attributes it keeps inline into a new
# dict, and every attribute read on it is slower from then on (a method reading
# two attributes: 36 -> 68 ns a call on 3.11). The dispatch reads it likewise.


def _own_state(obj: Any) -> Any:
    try:
        return object.__getattribute__(obj, STATE_KEY)  # not its class's __getattr__
    except AttributeError:
        return None


def _store_state(obj: Any, state: InstanceRecord) -> None:
    try:
        object.__setattr__(obj, STATE_KEY, state)  # not its class's __setattr__
    except TypeError:  # a C base with a setattr of its own, which object's cannot bypass
        vars(obj)[STATE_KEY] = state


# --- Reading the tiers -----------------------------------------------------------

class Origin(NamedTuple):
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


INSTANCE = Origin("instance")
FUNCTION_TIER = Origin("function")
GLOBAL_TIER = Origin("global")


class Entry(NamedTuple):
    """One callback of one event, with where it came from."""

    phase: str  # "pre", "post", "around", "error" or "on" (custom event)
    event: str  # normalized join point name, or the custom event name
    fn: Any
    options: Any
    source: Origin
    registration: Registration

    @property
    def origin(self) -> str:
        return str(self.source)


def _entry(registration: Registration, source: Origin) -> Entry:
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
        source = Origin("class", "list", klass.__qualname__)
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
        methods.append((attr, _entry(registration, Origin("class", "method", klass.__qualname__, attr))))
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
            source = Origin("class", "registered", klass.__qualname__)
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

    def pick(registrations: Iterable[Registration], source: Origin) -> list[Entry]:
        return pick_entries(_entry(r, source) for r in registrations)

    core = pick_entries(class_entries(tp)) if isinstance(tp, type) else []
    user: list[Entry] = []
    if jp is not None and jp.record is not None:
        user += pick(jp.record.registrations, FUNCTION_TIER)
    if state is not None:
        user += pick(state.callbacks, INSTANCE)
    return core + user + pick(GLOBAL.registrations, GLOBAL_TIER)
