"""Registering callbacks, in one straight line: the verbs (``before``, ``after``,
``around``, ``on_error``, ``on``, for any target: an instance, a class with all
its instances and subclasses, a module or a hookable function); the event parsed
once, at the public entry (``register``), into a ``Registration``; its owner
found (an instance's, a class's or a function's record, or the global one); the
entry checked against the join point (``_joinpoints``), and its order; stored on the
owner, which invalidates what it changed (``Record.add``). The ``Handle``
returned undoes it (``Record.remove``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from ._joinpoints import check_custom_callback, check_registration, fitting_step, planned_step
from ._dispatch import join_point_of
from ._entries import (
    CUSTOM,
    PHASES,
    normalize,
    parse_event,
    OrderGraph,
    Registration,
    make_options,
    order_entries,
)
from ._tiers import instance_state
from ._joinpoints import all_join_points, find_owner, has_join_points, name_join_point, spec_of
from ._owners import (
    GLOBAL,
    class_record,
    function_record,
    is_builtin_type,
    lock,
    refuse_late_class_changes,
    with_subclasses,
)
from ._policy import FUNCTION
from ._joinpoints import callable_label
from ._tiers import class_entries
from .errors import HookError, UnknownEventError, closest, safe_repr

__all__ = [
    "Handle",
    "Removable",
    "after",
    "around",
    "before",
    "on",
    "on_error",
    "register",
    "register_entries",
    "register_global",
]


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
# _tiers.InstanceRecord: each has `registrations`, `add`, `remove`), and the entry.
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
    where = f"{verb}({_target_label(target)}, {safe_repr(event)})"
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
