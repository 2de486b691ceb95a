"""The registry as users make and read it: registering, an instance's own record,
and reading an event's tiers in order.

Registering, in one straight line: the verbs (``before``, ``after``, ``around``,
``on_error``, ``on``, for any target: an instance, a class with all its
instances and subclasses, a module or a hookable function); the event parsed
once, at the public entry (``register``), into a ``Registration``; its owner
found (an instance's record, here, or a class's, a function's or the global
one, ``_owners``); the entry checked against the join point (``_joinpoints``),
and its order; stored on the owner, which invalidates what it changed
(``add``). The ``Handle`` returned undoes it (``remove``).

The instance's own record (``obj.callbacks`` and the chains built for it, an
``InstanceRecord`` stored on the object) lives here rather than with the other
owners because users change it directly (``obj.callbacks.append``, ``del``,
``[:] =``): its list checks every entry added that way with the checks
registering runs, and invalidates what each change touches itself.

The tiers: which callbacks one event has for one object, in the order they
run, each with a structured ``Origin`` that ``describe`` prints. In order
(Cerebras: core -> user -> global):

1. class tier (core): for each class of the MRO from base to most derived, its
   declared ``callbacks`` list, then its ``{phase}_<event>_callback`` methods;
   after all of those, run-time class registrations (``hw.before(Cls, ...)``),
   base class first;
2. user tier: ``obj.callbacks`` of the instance (``obj.before``, ``add_callback``
   append to it), or for a plain function its own registrations;
3. global tier: ``register_global_callback``.

Within a tier: registration order, ``prepend=True`` first, then ``before=`` /
``after=`` constraints (``_entries.order_entries``).
"""

from __future__ import annotations

import copy
from types import FunctionType, ModuleType
from typing import Any, Callable, Iterable, NamedTuple, TypeVar, cast

from ._dispatch import HookState
from ._entries import (
    CUSTOM,
    PHASES,
    Options,
    OrderGraph,
    Registration,
    callback_method_event,
    make_options,
    normalize,
    order_entries,
    parse_event,
)
from ._joinpoints import (
    all_join_points,
    callable_label,
    check_custom_callback,
    check_entry,
    check_event,
    check_registration,
    find_owner,
    fitting_step,
    has_join_points,
    join_point_of,
    name_join_point,
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
    function_record,
    is_builtin_type,
    lock,
    position,
    rebuild,
    refuse_late_class_changes,
    traced_ones,
    with_subclasses,
)
from ._rules import FUNCTION, STATE_KEY
from .errors import CallbackPicklingError, HookError, UnknownEventError, closest, safe_repr

__all__ = [
    "Entry",
    "FixedList",
    "Handle",
    "InstanceCallbackList",
    "InstanceRecord",
    "Origin",
    "Removable",
    "after",
    "around",
    "before",
    "can_hold_state",
    "check_class_tier",
    "class_entries",
    "entries_for",
    "instance_state",
    "on",
    "on_error",
    "register",
    "register_entries",
    "register_global",
    "runs_last",
]


# --- An instance's own record, and the tiers in order ----------------------------

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
    ordered = core + user + pick(GLOBAL.registrations, GLOBAL_TIER)
    if any(getattr(e.fn, _RUNS_LAST, False) for e in ordered):
        # After every other callback of its phase, whatever tier (runs_last).
        ordered = ([e for e in ordered if not getattr(e.fn, _RUNS_LAST, False)]
                   + [e for e in ordered if getattr(e.fn, _RUNS_LAST, False)])
    return ordered


_RUNS_LAST = "_hookwrap_runs_last"
_F = TypeVar("_F", bound=Callable[..., Any])


def runs_last(fn: _F) -> _F:
    """``fn`` (a reader, or any callable hookwrap may set an attribute on) marked to run
    after every other callback of its phase on the object, whatever tier each is
    in: a shipped callback that acts on what the whole phase decided (Checkpoint
    writing the file an evaluation made due, with every callback's state after that
    evaluation). Ordered when the chain is planned; the dispatch never sees it."""
    setattr(fn, _RUNS_LAST, True)
    return fn


class FixedList(list):  # type: ignore[type-arg]
    """A list that refuses every change (a class's declared ``callbacks``) with a ``HookError`` saying why, and what
    to do instead: its subclass's ``refusal``."""

    refusal = "this list cannot change."

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise HookError(self.refusal)

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse  # type: ignore[assignment]


# --- Registering: the verbs, parse, owner, check, store --------------------------

# --- Registering -----------------------------------------------------------------

class Removable:
    """Base of every handle hookwrap returns: ``remove()`` undoes what made it and
    returns None (hookwrap's own handles may be removed twice: the second does
    nothing); ``with handle:`` removes on exit. Subclass it and define ``remove()``."""

    __slots__ = ()

    def remove(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


# Where a registration was stored: its owner (an _owners.Record, or an instance's
# _registry.InstanceRecord: each has `registrations`, `add`, `remove`), and the entry.
Place = tuple[Any, Registration]


class Handle(Removable):
    """What every registration returns: ``remove()`` it (idempotent), or use it as a
    context manager. Registered without a function (``@obj.before("loss")``), it is
    the decorator: applying it registers the function and returns it unchanged."""

    __slots__ = ("_places", "_register", "__weakref__")

    def __init__(self, places: list[Place], register: Callable[[Any], Handle] | None = None) -> None:
        self._places = places
        self._register = register

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if self._register is None:
            raise HookError("this handle is already bound to a callback; register a new one.")
        registered = self._register(fn)
        self._places, self._register = registered._places, None
        return fn

    @property
    def active(self) -> bool:
        return any(any(e is entry for e in owner.registrations) for owner, entry in self._places)

    def remove(self) -> None:
        with lock:
            for owner, entry in self._places:
                owner.remove(entry)

    def __repr__(self) -> str:
        state = "active" if self.active else ("pending" if self._register else "removed")
        events = ", ".join(entry.event for _, entry in self._places)
        return f"<hookwrap.Handle {events or '-'} {state}>"


# What a check left to finish once the entries are stored: (cache, event key, the
# graph the entries were added to, what its owner's registrations will read as).
Pending = list[tuple[dict[Any, OrderGraph], Any, OrderGraph, Callable[[], Any]]]


def _check_order(owner: Any, new: list[Registration], pending: Pending) -> None:
    """Raise if ``new`` beside ``owner``'s entries makes a cycle of before=/after=.

    The owner keeps, per event, the graph of its entries' constraints
    (``owner.order_cache``, an ``OrderGraph`` in step with ``owner.registrations``
    while it has as many entries: any other change clears it): a new entry is
    checked against what it names and what names it, not against every entry.
    The full ``order_entries`` runs only for a cycle, to name it as it always has."""
    cache: dict[Any, OrderGraph] = owner.order_cache
    registrations = owner.registrations
    for key in dict.fromkeys((e.phase, e.name) for e in new):
        mine = [e for e in new if (e.phase, e.name) == key]
        graph = cache.get(key)
        if graph is None or graph.token != len(registrations):
            cache.pop(key, None)
            graph = _graph_of([e for e in registrations if (e.phase, e.name) == key], lambda e: e[1])
        if graph is None or not all([graph.add(e, e[1]) for e in mine]):
            cache.pop(key, None)
            order_entries([e for e in list(registrations) + new if (e.phase, e.name) == key])
            continue  # (order_entries raised: a cycle; never reached)
        cache[key] = graph
        pending.append((cache, key, graph, lambda: len(owner.registrations)))


def _graph_of(entries: list[Any], fn_of: Callable[[Any], Any]) -> OrderGraph | None:
    """The constraint graph of ``entries``; None where they make a cycle."""
    graph = OrderGraph()
    for entry in entries:
        graph.add(entry, fn_of(entry), check=False)
    pred = {node: set(before) for node, before in graph.pred.items()}
    ready = [node for node in range(graph.size) if node not in pred]
    placed = 0
    while ready:  # Kahn: acyclic if every node is placed
        node = ready.pop()
        placed += 1
        for after in graph.succ.get(node, ()):
            waiting = pred[after]
            waiting.discard(node)
            if not waiting:
                ready.append(after)
    return graph if placed == graph.size else None


def _tier_token(klass: type) -> tuple[Any, ...]:
    """What ``class_entries(klass)`` is read from: the records of its MRO, each with
    how many registrations it has and its class-body entries."""
    token: list[Any] = [klass.__mro__]
    for base in klass.__mro__:
        record = class_record(base, create=False)
        if record is not None:
            token += (record, len(record.registrations), record.prepared, record.own_entries)
    return tuple(token)


def _same(token: Any, other: Any) -> bool:
    return token is not None and other is not None and len(token) == len(other) and all(
        a is b or (type(a) is int and type(b) is int and a == b) for a, b in zip(token, other))


def _class_tier_order(cls: type) -> Callable[[Any, list[Registration], Pending], None]:
    """``_check_order`` for a class's registrations, which are ordered within its
    whole class tier: its bases' and its own declared entries and registrations,
    and, for each subclass, that subclass's too. A cycle with any of them is
    refused now, where every call would raise it. Each class keeps the graphs of
    its whole tier (``record.order_cache``), in step while its ``_tier_token`` is."""
    def check(owner: Any, new: list[Registration], pending: Pending) -> None:
        keys = dict.fromkeys((r.phase, r.name) for r in new)
        for klass in with_subclasses(cls):
            record = class_record(klass, create=False)
            if record is None:
                continue
            for base in reversed(klass.__mro__):  # as class_entries(klass) would, cached or not
                base_record = class_record(base, create=False)
                if base_record is not None and base_record.prepared:
                    base_record.refuse_late_changes()
            tier: list[Any] | None = None
            cache = record.order_cache
            token = _tier_token(klass)
            for key in keys:
                mine = [r for r in new if (r.phase, r.name) == key]
                graph = cache.get(key)
                if graph is None or not _same(graph.token, token):
                    cache.pop(key, None)
                    if tier is None:
                        tier = [e for e in class_entries(klass) if (e.phase, e.event) in keys]
                    graph = _graph_of([e for e in tier if (e.phase, e.event) == key], lambda e: e.fn)
                if graph is None or not all([graph.add(r, r.fn) for r in mine]):
                    cache.pop(key, None)
                    entries = [e for e in class_entries(klass) if (e.phase, e.event) == key]
                    order_entries(entries + mine, lambda e: e.fn)
                    continue  # (order_entries raised: a cycle; never reached)
                cache[key] = graph
                pending.append((cache, key, graph, lambda klass=klass: _tier_token(klass)))  # type: ignore[misc]
    return check


def _add(owner: Any, new: list[Registration],
         check: Callable[[Any, list[Registration], Pending], None] = _check_order) -> Handle:
    """Store checked entries on ``owner`` (which invalidates what they change) once
    their ordering is known to hold; return their handle."""
    return _add_all([(owner, new)], check)


def _add_all(groups: list[tuple[Any, list[Registration]]],
             check: Callable[[Any, list[Registration], Pending], None] = _check_order) -> Handle:
    """``_add`` of several owners' entries, under the lock: their ordering checked
    first, then all stored, or (a cycle) none. The graphs the check grew are kept
    once the entries are stored, and dropped if anything fails first."""
    with lock:
        pending: Pending = []
        try:
            for owner, new in groups:
                check(owner, new, pending)
            for owner, new in groups:
                owner.add(new)
        except BaseException:
            for cache, key, graph, _ in pending:
                if cache.get(key) is graph:
                    del cache[key]
            raise
        for cache, key, graph, token in pending:
            if cache.get(key) is graph:
                graph.token = token()
    return Handle([(owner, entry) for owner, new in groups for entry in new])


def _target_label(target: Any) -> str:
    if isinstance(target, type):
        return target.__qualname__
    if isinstance(target, ModuleType):
        return target.__name__
    jp = join_point_of(target)
    if jp is not None:
        return str(getattr(jp.func, "__qualname__", jp.event))
    return f"{type(target).__qualname__} instance"


def _unknown_in_function(jp: Any, registration: Registration, where: str) -> UnknownEventError:
    return UnknownEventError(
        f"{where}: the join point {jp.event!r} has no event {registration.event!r}; its events are "
        + ", ".join(f"'{p}-{jp.event}'" for p in PHASES) + "."
    )


def _check_function(jp: Any, registrations: list[Registration], where: str) -> None:
    spec = spec_of(jp)
    for registration in registrations:
        if registration.phase == CUSTOM or registration.name != normalize(jp.event):
            raise _unknown_in_function(jp, registration, where)
        planned_step(registration, spec)


def registered_on(target: Any) -> list[Registration]:
    """What is registered on ``target`` itself: an instance's own tier, a class's own
    registrations, a function's; nothing for a module (its functions hold theirs).
    Creates no record."""
    jp = join_point_of(target)
    if isinstance(target, ModuleType):
        return []
    if jp is not None and jp.binding == FUNCTION and jp.owner is None:
        return list(jp.record.registrations) if jp.record is not None else []
    if jp is not None:
        target = jp.owner
    if isinstance(target, type):
        record = class_record(target, create=False)
        return list(record.registrations) if record is not None else []
    try:
        state = instance_state(target, create=False)
    except HookError:  # it cannot hold callbacks: registering says so
        return []
    return list(state.registrations) if state is not None else []


def register_entries(target: Any, registrations: list[Registration], where: str) -> Handle:
    """Register parsed entries on an instance, a class, a module or a function."""
    jp = join_point_of(target)
    if isinstance(target, ModuleType):
        funcs = {normalize(j.event): j for j in map(join_point_of, vars(target).values()) if j is not None}
        for registration in registrations:
            if registration.name not in funcs:
                raise UnknownEventError(
                    f"{where}: module {target.__name__} has no join point {registration.name!r}."
                    + closest(registration.name, [j.event for j in funcs.values()])
                    + " Make the function hookable with @hookwrap.hookable or hookwrap.weave()."
                )
        by_function: dict[Any, list[Registration]] = {}
        for registration in registrations:
            by_function.setdefault(funcs[registration.name], []).append(registration)
        for function, entries in by_function.items():  # every check first: all or nothing
            _check_function(function, entries, where)
        return _add_all([(function_record(function), entries) for function, entries in by_function.items()])
    if jp is not None and jp.binding == FUNCTION and jp.owner is None:
        found = find_owner(jp)
        if found is not None:  # a method Python never named (pure twin, a plain class)
            name_join_point(vars(found[0])[found[1]], *found)
        else:
            _check_function(jp, registrations, where)
            return _add(function_record(jp), registrations)
    if jp is not None:  # a method join point: its class
        target = jp.owner
    if isinstance(target, type):
        cls = target
        refuse_late_class_changes(cls)
        for registration in registrations:
            check_registration(cls, registration, where)
        record = class_record(cls)
        assert record is not None
        return _add(record, registrations, _class_tier_order(cls))
    if any(r.phase != CUSTOM for r in registrations) and not has_join_points(type(target)):
        tp = type(target)
        fix = ("it is a built-in type: hook the Python code that uses it" if is_builtin_type(tp)
               else f"make its methods hookable with @hookwrap.hookable, or, for a class you cannot "
                    f"edit, hookwrap.weave({tp.__qualname__}, {registrations[0].name!r})")
        raise UnknownEventError(f"{where}: {tp.__qualname__} has no join points; {fix}.")
    refuse_late_class_changes(type(target))
    state = instance_state(target)
    assert state is not None
    for registration in registrations:
        check_registration(type(target), registration, where)
    return _add(state, registrations)


def register(target: Any, phase: str, event: Any, fn: Any, opts: dict[str, Any]) -> Handle:
    """``before``/``after``/``around``/``on_error``/``on``: one callback on a target."""
    verb = {"pre": "before", "post": "after", "around": "around", "error": "on_error", CUSTOM: "on"}[phase]
    # A plain string's repr cannot raise: safe_repr is for what else users pass.
    shown = repr(event) if type(event) is str and len(event) < 64 else safe_repr(event)
    where = f"{verb}({_target_label(target)}, {shown})"
    if not isinstance(event, str):
        raise HookError(f"{where}: the event must be a string, got {type(event).__name__}.")
    event = str.__str__(event)  # a str subclass's own __hash__/__eq__ never run in the tables
    if phase == CUSTOM:
        if "-" in event:
            raise HookError(f"{where}: on() takes a custom event name like 'on_fit_end', got {safe_repr(event)}.")
    elif event.partition("-")[0] in PHASES and "-" in event:
        raise HookError(
            f"{where}: {verb}() takes a join point name like 'step', got {safe_repr(event)}. "
            f"Pass the join point, not the event."
        )
    options = make_options(where, **opts)
    if fn is None:
        return Handle([], lambda f: register(target, phase, event, f, opts))
    if options is not None and any(ref is fn for ref in options.before + options.after):
        raise HookError(f"{where}: {callable_label(fn)} is ordered before= or after= itself; "
                        f"name another callback.")
    full = event if phase == CUSTOM else f"{phase}-{event}"
    registration = Registration(full, fn, options, parse_event(full, where))  # the one parse
    return register_entries(target, [registration], where)


def register_global(registrations: list[Registration], where: str) -> Handle:
    """Global tier: checked against every join point of that event known now."""
    for registration in registrations:
        if registration.phase == CUSTOM:
            check_custom_callback(registration.fn, where, pass_obj=True)
            continue
        known_now = all_join_points()
        matching = [jp for jp in known_now if normalize(jp.event) == registration.name]
        if not matching:
            known = sorted({f"{p}-{jp.event}" for jp in known_now for p in PHASES})
            raise UnknownEventError(
                f"{where}: no join point {registration.name!r} exists."
                + closest(registration.event, known)
                + " Define or import the hookable code before registering a global callback for it."
            )
        # It runs on the join points it fits (fitting_step) and must fit one.
        if all(fitting_step(registration, spec_of(jp)) is None for jp in matching):
            planned_step(registration, spec_of(matching[0]))  # raises why it does not fit
    return _add(GLOBAL, registrations)


def check_stand_in(handle: Handle, stand_in: Any, real: Any) -> None:
    """Raise why a global registration of ``handle`` that fits join point
    ``stand_in`` does not fit ``real``, the join point that took its place (made
    after the registration was checked against the stand-in)."""
    if stand_in is None or real is None:
        return
    name = normalize(stand_in.event)
    for _, registration in handle._places:
        if registration.name == name and registration.phase != CUSTOM \
                and fitting_step(registration, spec_of(stand_in)) is not None:
            planned_step(registration, spec_of(real))


# --- The verbs -------------------------------------------------------------------

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
