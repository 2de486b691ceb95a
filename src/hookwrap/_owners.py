"""Where hookwrap keeps its state: on the thing it belongs to, never in a table
that would keep that thing alive.

* a class: a ``ClassRecord`` stored in the class itself (``__hookwrap_class__``):
  its run-time registrations, its declared callbacks, the chains built for its
  instances, and its caches. A record that points back at its class is a cycle
  the collector frees with the class; a module-level dict or a
  ``WeakKeyDictionary`` would not be (a value that refers to its key, such as a
  callback method using ``super()``, keeps the key alive);
* a plain function join point: a ``Record`` in ``jp.record``;
* an instance: ``InstanceRecord`` in its own attribute ``__hookwrap__`` (``_registry``);
* the global tier: ``GLOBAL``.

Every owner stores and removes its registrations itself (``add``, ``remove``) and
invalidates, in its ``changed(event)``, only the caches that read them: the chains of that event, for that class and its subclasses,
that function, that instance, or (global) every class. Caches are dropped and
their chains marked invalid, so a call already holding one finds it stale and
nothing keeps a removed callback alive. Of the chains a change drops, those
torch.compile traced are built again at once (``rebuild``): compiled code
re-traces them on its next call, and a chain missing then would be a graph break.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Iterator

from ._entries import callback_method_event, normalize
from ._rules import RECORD_ATTR, STATE_KEY
from .errors import HookError

__all__ = [
    "GLOBAL",
    "ClassCallbacksAttribute",
    "ClassRecord",
    "Record",
    "callback_methods",
    "changed_class",
    "class_record",
    "discard_class_record",
    "drop_chains",
    "drop_emit_events",
    "function_record",
    "is_builtin_type",
    "lock",
    "position",
    "rebuild",
    "refuse_late_class_changes",
    "traced_ones",
    "with_subclasses",
]

# One lock for every registration and every chain build (re-entrant: a build
# checks a class tier, which may find join points).
lock = threading.RLock()


class Record:
    """The registrations of one owner, and the chains built from them. Every owner
    of registrations (this, ClassRecord, the GLOBAL one, an instance's
    _registry.InstanceRecord) has ``registrations``, ``add(entries)``,
    ``remove(entry)`` and ``changed(event)``: the one place that invalidates what
    a change of them touches. Callers hold ``lock`` and have checked the entries."""

    __slots__ = ("registrations", "chains", "order_cache", "__weakref__")

    def __init__(self) -> None:
        self.registrations: list[Any] = []  # options.Registration, in order
        self.chains: dict[Any, Any] = {}  # join point -> Chain
        # (phase, event) -> options.OrderGraph of those registrations' before=/after=,
        # kept by registration (_registry) while they are only added to.
        self.order_cache: dict[Any, Any] = {}

    def add(self, entries: list[Any]) -> None:
        self.registrations.extend(entries)
        for event in dict.fromkeys(entry.name for entry in entries):
            self.changed(event)

    def remove(self, entry: Any) -> bool:
        """Remove ``entry`` itself (not an equal pair); False if it is not here."""
        i = position(self.registrations, entry)
        if i is None:
            return False
        del self.registrations[i]
        self.forget_order()
        self.changed(entry.name)
        return True

    def forget_order(self) -> None:
        """Registrations were removed or replaced: the ordering graphs kept from them
        go (they hold the entries), and are built again at the next registration."""
        self.order_cache.clear()

    def changed(self, event: str | None) -> None:
        """A function join point's registrations changed (it has one event): drop
        its chains, building again those compiled code traced."""
        with lock:
            rebuild(traced_ones(self.drop_chains(None)))

    def drop_chains(self, event: str | None) -> list[tuple[Any, Any]]:
        dropped = drop_chains(self.chains, event)
        for jp, _ in dropped:
            if jp.owner is None:  # a function: its last chain is this one
                jp.forget_last_chain()
        return dropped


def position(entries: list[Any], entry: Any) -> int | None:
    """Where ``entry`` itself (not an equal pair) is in ``entries``."""
    for i, e in enumerate(entries):
        if e is entry:
            return i
    return None


def drop_chains(chains: dict[Any, Any], event: str | None) -> list[tuple[Any, Any]]:
    """Invalidate and drop the chains (join point -> Chain) of ``event`` (normalized;
    None: all); returns them, as (join point, chain)."""
    dropped = [(jp, chains.pop(jp)) for jp in list(chains)
               if event is None or normalize(jp.event) == event]
    for _, chain in dropped:
        chain.valid = False
    return dropped


def drop_emit_events(cache: dict[str, Any], event: str | None) -> None:
    """Drop the gathered listeners (``emit``) of custom event ``event`` (None: all)."""
    if event is None:
        cache.clear()
    else:
        cache.pop(event, None)


def traced_ones(dropped: list[tuple[Any, Any]], state: Any = None) -> list[tuple[Any, Any, Any]]:
    """Of dropped chains, those torch.compile traced, for ``rebuild``."""
    return [(jp, chain.tp, state) for jp, chain in dropped if chain.read_by_trace]


def rebuild(dropped: list[tuple[Any, Any, Any]]) -> None:
    """Build again, now, chains a change dropped that compiled code had traced:
    (join point, class, the instance state or None). That code re-traces them
    on its next call and finds them built (see _traced)."""
    for jp, tp, state in dropped:
        type_chain = jp.planner.type_chain(jp, tp)
        type_chain.traced  # noqa: B018 (keeps the mark: compiled code will trace it again)
        if state is not None and type_chain.check_state:
            state.chain_for(jp, type_chain).traced  # noqa: B018


class ClassRecord(Record):
    """What hookwrap keeps about one class, stored in the class."""

    __slots__ = ("cls", "prepared", "declared", "body", "own_entries", "join_points", "checked",
                 "stateful", "own_getattribute", "states", "emit_cache")

    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls
        self.prepared = False  # a Hookable subclass: its callbacks list and methods count
        self.declared: tuple[Any, ...] | None = ()  # its `callbacks` list, parsed; None drops
        self.body: dict[str, Any] = {}  # its callback methods when it was created
        self.own_entries: list[Any] | None = None  # its class-body entries (cache)
        self.join_points: dict[str, Any] | None = None  # event -> join point (cache)
        self.checked = False  # its class tier passed the checks
        self.stateful = False  # some instance holds callbacks of its own
        # Its own __getattribute__ (a proxy) may answer `obj.__hookwrap__` for another
        # object: the pure twin reads its instances' state with object's.
        self.own_getattribute = getattr(cls, "__getattribute__") is not object.__getattribute__
        self.states: weakref.WeakSet[Any] = weakref.WeakSet()  # those instances' InstanceRecord
        self.emit_cache: dict[str, Any] = {}  # custom event -> listeners

    def changed(self, event: str | None) -> None:
        changed_class(self.cls, event)

    def forget_order(self) -> None:
        """A class's graphs cover its whole class tier (its bases' registrations):
        its subclasses' graphs hold its entries too."""
        forget_class_order(self.cls)

    def refuse_late_changes(self) -> None:
        """A class's ``callbacks`` list and callback methods are read when it is
        created; one assigned later would be ignored (no metaclass sees the
        assignment: Hookable mixes with ABC and other metaclasses), so it is refused
        wherever the class tier is read next: a registration, a call planning its
        chain, ``describe``."""
        klass = self.cls
        where = klass.__qualname__
        fix = (f"Declare it in the class body, or register for every instance with "
               f"hookwrap.before({where}, 'step', fn) (after, around, on_error), or on one object "
               f"with obj.before(...).")
        late = vars(klass).get("callbacks")
        if late is not None and not isinstance(late, ClassCallbacksAttribute):
            raise HookError(f"{where}.callbacks was assigned after the class was created, where "
                            f"it is not read (its declared list is fixed then). {fix}")
        now = callback_methods(klass)
        if now != self.body:
            changed = sorted(attr for attr in now.keys() | self.body.keys()
                             if now.get(attr, _GONE) is not self.body.get(attr, _GONE))
            raise HookError(f"{where}.{changed[0]} was assigned or deleted after the class was "
                            f"created, where it is not read (callback methods are read then). {fix}")


    def drop(self, event: str | None) -> list[tuple[Any, Any, Any]]:
        """Drop the chains of ``event`` (None: all) built for this class and its
        instances; returns them for ``rebuild``."""
        dropped = traced_ones(self.drop_chains(event))
        drop_emit_events(self.emit_cache, event)
        for state in list(self.states):
            gone = state.drop(event)
            if state.ready:
                dropped.extend(traced_ones(gone, state))
        return dropped


_GONE = object()


class ClassCallbacksAttribute:
    """Base of the descriptor that serves ``obj.callbacks`` (see _mixin): what a
    Hookable class's ``callbacks`` attribute is once the class is created."""


def callback_methods(klass: type) -> dict[str, Any]:
    """``klass``'s own ``{phase}_<event>_callback`` attributes."""
    return {attr: value for attr, value in list(vars(klass).items()) if callback_method_event(attr)}


def refuse_late_class_changes(tp: type) -> None:
    """``ClassRecord.refuse_late_changes`` for ``tp`` and each prepared class it
    derives from."""
    for klass in tp.__mro__:
        record = class_record(klass, create=False)
        if record is not None and record.prepared:
            record.refuse_late_changes()


class GlobalRecord(Record):
    """The global tier's registrations (one, GLOBAL): they reach every record."""

    __slots__ = ()

    def changed(self, event: str | None) -> None:
        """Every class's chains of ``event``, and every function join point's."""
        with lock:
            dropped: list[tuple[Any, Any, Any]] = []
            for record in list(_records):
                if isinstance(record, ClassRecord):
                    dropped.extend(record.drop(event))
                else:
                    dropped.extend(traced_ones(record.drop_chains(event)))
            rebuild(dropped)


# Every record, weakly: a global registration reaches each of them.
_records: weakref.WeakSet[Record] = weakref.WeakSet()
GLOBAL = GlobalRecord()


def is_builtin_type(cls: type) -> bool:
    """A built-in or extension type (Py_TPFLAGS_IMMUTABLETYPE): its attributes cannot
    be set, so it holds no record, no join point and no woven method."""
    return bool(cls.__flags__ & (1 << 8))


def class_record(cls: type, create: bool = True) -> ClassRecord | None:
    """The record stored in ``cls`` (not inherited), created on first use."""
    record = cls.__dict__.get(RECORD_ATTR)
    if record is None and create:
        with lock:
            record = cls.__dict__.get(RECORD_ATTR)
            if record is None:
                record = ClassRecord(cls)
                try:
                    type.__setattr__(cls, RECORD_ATTR, record)
                    # What reading an instance's state finds where it holds none:
                    # the read stops here, before any __getattr__ of the class
                    # (nn.Module's raises, ~1 us; a delegating one would lend
                    # another object's state).
                    if STATE_KEY not in cls.__dict__:
                        type.__setattr__(cls, STATE_KEY, None)
                except (TypeError, AttributeError) as exc:
                    raise HookError(
                        f"hookwrap cannot keep callbacks on {cls.__qualname__} ({exc}); "
                        f"built-in and extension types cannot hold join points. Subclass it in "
                        f"Python and hook the subclass."
                    ) from None
                _records.add(record)
    return record


def function_record(jp: Any) -> Record:
    """The record of a plain function join point (its own registrations)."""
    if jp.record is None:
        with lock:
            if jp.record is None:
                jp.record = Record()
                _records.add(jp.record)
    return jp.record  # type: ignore[no-any-return]


def discard_class_record(cls: type) -> None:
    """Forget everything kept on ``cls`` (its join points were all un-woven)."""
    with lock:
        record = cls.__dict__.get(RECORD_ATTR)
        if record is not None:
            record.drop(None)
            forget_class_order(cls)
            record.registrations.clear()  # they go with it: their handles say so
            type.__delattr__(cls, RECORD_ATTR)
            if STATE_KEY in cls.__dict__ and cls.__dict__[STATE_KEY] is None:  # class_record's
                type.__delattr__(cls, STATE_KEY)


def with_subclasses(cls: type) -> Iterator[type]:
    seen: set[int] = set()
    pending = [cls]
    while pending:
        klass = pending.pop()
        if id(klass) in seen:
            continue
        seen.add(id(klass))
        yield klass
        try:
            pending.extend(type.__subclasses__(klass))
        except TypeError:  # a metaclass's own __subclasses__
            pending.extend(klass.__subclasses__())


def changed_class(cls: type, event: str | None, structure: bool = False) -> None:
    """Registrations on ``cls`` changed for ``event`` (None: all): drop what its
    instances and its subclasses' instances built from them. ``structure``: its
    join points changed (weaving), so their lookup caches go too."""
    with lock:
        dropped = []
        for klass in with_subclasses(cls):
            record = class_record(klass, create=False)
            if record is None:
                continue
            if structure:
                record.join_points = None
                record.own_entries = None
                record.checked = False
                record.order_cache.clear()
            dropped.extend(record.drop(event))
        if not structure:  # weaving resets Dynamo instead
            rebuild(dropped)


def forget_class_order(cls: type) -> None:
    """Clear the ordering graphs of ``cls`` and its subclasses (each covers its
    class tier, which has ``cls``'s entries)."""
    with lock:
        for klass in with_subclasses(cls):
            record = class_record(klass, create=False)
            if record is not None:
                record.order_cache.clear()
