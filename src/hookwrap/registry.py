"""Where callbacks are registered, and how they become the chain a call runs.

Tiers, in the order they run for one event on one object (Cerebras: core ->
user -> global):

1. class tier (core): for each class of the MRO from base to most derived, its
   declared ``callbacks`` list, then its ``{phase}_<event>_callback`` methods;
   after all of those, run-time class registrations (``hw.before(Cls, ...)``),
   base class first;
2. user tier: ``obj.callbacks`` of the instance (``obj.before``, ``add_callback``
   append to it), or for a plain function its own registrations;
3. global tier: ``register_global_callback``.

Within a tier: registration order, ``prepend=True`` first, then ``before=`` /
``after=`` constraints (``options.order_entries``).

Chains are built here, in pure Python, on a cache miss; the dispatch module
caches them per class (on the join point) and per instance (``HookState``),
and one global version counter (``invalidate``) marks every cache stale when
anything is registered or removed. A call runs the tuples it read at its
start (snapshot semantics); registration holds one lock.
"""

from __future__ import annotations

import threading
import weakref
from types import FunctionType, ModuleType
from typing import Any, Callable, Iterable, NamedTuple

from ._dispatch import (
    AROUND,
    ERROR,
    FUNCTION,
    METHOD,
    POST,
    PRE,
    STATE_KEY,
    Chain,
    HookState,
    JoinPoint,
    current_version,
    invalidate,
    set_resolvers,
)
from .asyncrun import run_chain_async
from .errors import HookError, UnknownEventError, closest
from .events import CUSTOM, PHASES, callback_method_event, normalize, parse_event
from .options import Registration, make_options, options_of, order_entries
from .signature import JoinPointSpec, callable_label, plan_step

__all__ = [
    "ClassCallbacksAttribute",
    "Entry",
    "Handle",
    "InstanceCallbackList",
    "InstanceHooks",
    "Removable",
    "all_join_points",
    "as_join_point",
    "declared_callbacks",
    "declared_custom_events",
    "entries_for",
    "find_join_point",
    "instance_state",
    "join_points",
    "name_join_point",
    "prepare_class",
    "register",
    "register_entries",
    "register_global",
    "track_join_point",
]

_lock = threading.RLock()
PHASE_CODES = {"pre": PRE, "post": POST, "around": AROUND, "error": ERROR}


class Entry(NamedTuple):
    """One callback of one event, with where it came from (for describe())."""

    phase: str  # "pre", "post", "around", "error" or "on" (custom event)
    event: str  # normalized join point name, or the custom event name
    fn: Any
    options: Any
    origin: str


# class -> its declared `callbacks` entries as written, or None (`callbacks = None`).
_declared: weakref.WeakKeyDictionary[type, tuple[tuple[str, Any], ...] | None] = (
    weakref.WeakKeyDictionary()
)
# class -> run-time registrations (hw.before(Cls, ...)): Registration entries.
_class_registrations: weakref.WeakKeyDictionary[type, list[Any]] = weakref.WeakKeyDictionary()
# plain-function join point -> its registrations (fn.before(cb), hw.before(fn, ...)).
_function_registrations: dict[Any, list[Any]] = {}
_global_registrations: list[Any] = []
_all_join_points: weakref.WeakSet[Any] = weakref.WeakSet()
_specs: dict[Any, JoinPointSpec] = {}
_checked: weakref.WeakSet[type] = weakref.WeakSet()  # classes whose class tier passed
# Hookable subclasses: only they declare callbacks (a `callbacks` list, `*_callback`
# methods). On any other class -- a woven third-party one -- such names mean nothing.
_prepared: weakref.WeakSet[type] = weakref.WeakSet()
# Classes some instance of which holds callbacks of its own (an InstanceHooks):
# only their calls look for instance state.
_stateful_types: weakref.WeakSet[type] = weakref.WeakSet()
_join_point_cache: weakref.WeakKeyDictionary[type, tuple[int, dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)
_class_entry_cache: weakref.WeakKeyDictionary[type, tuple[int, list[Entry]]] = (
    weakref.WeakKeyDictionary()
)


# --- join points ------------------------------------------------------------


def all_join_points() -> list[Any]:
    return list(_all_join_points)


def track_join_point(jp: Any) -> Any:
    """Remember every join point, so a global callback can be checked against them."""
    _all_join_points.add(jp)
    return jp


def as_join_point(value: Any) -> Any:
    """The JoinPoint behind a class attribute (or None): bare, or inside a wrapt wrapper."""
    if isinstance(value, (classmethod, staticmethod)):
        value = value.__func__
    if type(value) is JoinPoint:
        return value
    if type(value) is FunctionType:  # the pure twin stores a dispatch function
        return value.__dict__.get("__hookwrap_join_point__")
    if getattr(type(value), "_hookwrap_join_point", False):
        return value._self_join_point
    return None


def name_join_point(value: Any, owner: type, name: str) -> None:
    """``__set_name__`` for a join point that Python did not name: stored in a class
    after its creation, inside a classmethod/staticmethod, or (pure twin) stored as
    its dispatch function."""
    jp = as_join_point(value)
    if jp is None:
        return
    if type(value) is JoinPoint:
        value.__set_name__(owner, name)
        return
    jp.owner, jp.attr_name = owner, name
    if not jp.explicit_event:
        jp.event = name
    if type(value) is FunctionType and jp.binding == FUNCTION:
        jp.binding = METHOD  # a plain function in a class body: an instance method


def join_points(tp: type) -> dict[str, Any]:
    """Normalized event name -> the most derived join point of that event on ``tp``."""
    version = current_version()
    cached = _join_point_cache.get(tp)
    if cached is not None and cached[0] == version:
        return cached[1]
    found: dict[str, Any] = {}
    for klass in tp.__mro__:
        for attr, value in vars(klass).items():
            jp = as_join_point(value)
            if jp is not None:
                if jp.owner is None:
                    name_join_point(value, klass, attr)
                found.setdefault(normalize(jp.event), jp)
    _join_point_cache[tp] = (version, found)
    return found


def declared_custom_events(tp: type) -> set[str]:
    """The custom event names ``tp`` declares in ``emits`` (with its bases)."""
    names: set[str] = set()
    for klass in tp.__mro__:
        emits = vars(klass).get("emits")
        if isinstance(emits, str):
            raise HookError(f"{klass.__qualname__}.emits must be a list of event names, not a string.")
        if emits:
            names.update(emits)
    return names


def _known_events(tp: type) -> list[str]:
    events = [f"{p}-{jp.event}" for jp in join_points(tp).values() for p in PHASES]
    return events + sorted(declared_custom_events(tp))


def find_join_point(tp: type, event: str, where: str) -> Any:
    """The join point for ``event`` on ``tp``, or UnknownEventError with the closest names."""
    jp = join_points(tp).get(normalize(event))
    if jp is None:
        known = sorted({jp.event for jp in join_points(tp).values()})
        raise UnknownEventError(
            f"{where}: {tp.__qualname__} has no join point {event!r}."
            + closest(event, known)
            + f" Join points of {tp.__qualname__}: {', '.join(known) or '(none)'}. "
            f"Make the method hookable with @hookwrap.hookable."
        )
    return jp


def check_event(tp: type, phase: str, name: str, where: str) -> Any:
    """Check that ``tp`` has this event; returns its join point (None for custom events)."""
    if phase != CUSTOM:
        return find_join_point(tp, name, where)
    if name not in declared_custom_events(tp):
        raise UnknownEventError(
            f"{where}: {tp.__qualname__} declares no custom event {name!r}."
            + closest(name, _known_events(tp))
            + f" Declare it in the class: `emits = ({name!r},)`."
        )
    return None


def spec_of(jp: Any) -> JoinPointSpec:
    spec = _specs.get(jp)
    if spec is None or spec.event != jp.event:
        spec = _specs[jp] = JoinPointSpec(jp)
    return spec


def _fires(jp: Any, tp: Any) -> bool:
    """False when ``tp`` overrides this join point: the call is a ``super()`` call
    from inside the override, whose callbacks already ran."""
    name = jp.attr_name
    if name is None or not isinstance(tp, type):
        return True
    for klass in tp.__mro__:
        if name in vars(klass):
            return as_join_point(vars(klass)[name]) is jp
    return True


# --- gathering the entries of an event ----------------------------------------


def _parse_entries(entries: Iterable[Any], origin: str) -> list[Entry]:
    out = []
    for entry in entries:
        event, fn = entry
        phase, name = parse_event(event, origin)
        out.append(Entry(phase, normalize(name) if phase != CUSTOM else name, fn, options_of(entry), origin))
    return out


def _class_entries(tp: type) -> list[Entry]:
    """The class tier of ``tp``: declared (base first), then run-time registrations."""
    version = current_version()
    cached = _class_entry_cache.get(tp)
    if cached is not None and cached[0] == version:
        return cached[1]
    entries: list[Entry] = []
    mro = list(reversed(tp.__mro__))
    for klass in mro:
        if klass not in _prepared:
            continue
        if klass in _declared:
            declared = _declared[klass]
            if declared is None:  # `callbacks = None`: drop the inherited lists
                entries = [e for e in entries if not e.origin.startswith("class list")]
            else:
                entries += _parse_entries(declared, f"class list {klass.__qualname__}.callbacks")
        for attr, value in vars(klass).items():
            parsed = callback_method_event(attr)
            if parsed is None:
                continue
            origin = f"class method {attr}"
            if value is None:  # `pre_step_callback = None` drops the inherited one
                entries = [e for e in entries if not e.origin.startswith(origin + " ")]
                continue
            if not isinstance(value, FunctionType):
                raise HookError(
                    f"{klass.__qualname__}.{attr} looks like a callback method but is a "
                    f"{type(value).__name__}; define it as a plain method `def {attr}(self, ...)`."
                )
            phase, name = parsed
            entries.append(Entry(phase, normalize(name), value, None, f"{origin} ({klass.__qualname__})"))
    for klass in mro:
        registered = _class_registrations.get(klass)
        if registered:
            entries += _parse_entries(registered, f"class {klass.__qualname__} (registered)")
    _class_entry_cache[tp] = (version, entries)
    return entries


def _ordered(entries: list[Entry]) -> list[Entry]:
    """Apply prepend/before/after within one tier, per phase."""
    if not any(e.options is not None for e in entries):
        return entries
    out: list[Entry] = []
    for phase in dict.fromkeys(e.phase for e in entries):
        out += order_entries([e for e in entries if e.phase == phase], lambda e: e.fn)
    return out


def entries_for(event: str, phase_filter: Callable[[str], bool], tp: Any, jp: Any,
                state: Any) -> list[Entry]:
    """Every entry of ``event`` for one object (or class/function), tier by tier, in order."""
    def pick(entries: Iterable[Entry]) -> list[Entry]:
        return _ordered([e for e in entries if e.event == event and phase_filter(e.phase)])

    core = pick(_class_entries(tp)) if isinstance(tp, type) else []
    user: list[Entry] = []
    if jp is not None and jp in _function_registrations:
        user += pick(_parse_entries(_function_registrations[jp], "function"))
    if state is not None:
        user += pick(_parse_entries(state.callbacks, "instance"))
    glob = pick(_parse_entries(_global_registrations, "global"))
    return core + user + glob


# (spec, phase, fn, gate) -> planned Step. Any registration invalidates every
# chain; rebuilding them should not read each callback's signature again.
_step_cache: dict[tuple[Any, ...], Any] = {}


def _planned(fn: Any, phase: int, spec: JoinPointSpec, gate: Any) -> Any:
    key = (spec, phase, fn, gate)
    try:
        step = _step_cache.get(key)
    except TypeError:  # an unhashable callable: plan it each time
        return plan_step(fn, phase, spec, spec.has_obj, gate)
    if step is None:
        if len(_step_cache) > 4096:
            _step_cache.clear()
        step = _step_cache[key] = plan_step(fn, phase, spec, spec.has_obj, gate)
    return step


def _build_chain(jp: Any, tp: Any, state: Any, version: int) -> Any:
    spec = spec_of(jp)
    steps: dict[int, list[Any]] = {PRE: [], POST: [], AROUND: [], ERROR: []}
    check_state = state is None and jp.binding == METHOD and tp in _stateful_types
    for e in entries_for(normalize(jp.event), lambda p: p != CUSTOM, tp, jp, state):
        phase = PHASE_CODES[e.phase]
        gate = e.options.gate if e.options is not None else None
        steps[phase].append(_planned(e.fn, phase, spec, gate))
    return Chain(tp, version, True, tuple(steps[PRE]), tuple(steps[POST]),
                 tuple(steps[AROUND]), tuple(steps[ERROR]), check_state)


def resolve_type(jp: Any, tp: Any) -> Any:
    """The chain of ``jp`` for instances of ``tp`` (no instance tier). Cached on ``jp``."""
    with _lock:
        version = current_version()
        chain = jp.chains.get(tp)
        if chain is not None and chain.version == version:
            return chain
        if isinstance(tp, type) and tp not in _checked:
            check_class_tier(tp)
            _checked.add(tp)
        if not _fires(jp, tp):
            chain = Chain(tp, version, False, (), ())
        else:
            chain = _build_chain(jp, tp, None, version)
        jp.chains[tp] = chain
        return chain


def resolve_instance(state: InstanceHooks, jp: Any, type_chain: Any) -> Any:
    """The chain of ``jp`` for one instance: class, instance, then global tier."""
    with _lock:
        return _build_chain(jp, type_chain.tp, state, current_version())


# --- the instance tier ------------------------------------------------------


class InstanceCallbackList(list):  # type: ignore[type-arg]
    """``obj.callbacks``: this instance's ``(event, fn)`` entries.

    A list of the object's own; the class's declared list is never touched.
    Every entry is checked when it is added (unknown event, bad signature), and
    every change takes effect at the next call.
    """

    __slots__ = ("_cls",)

    def __init__(self, cls: type, items: Iterable[Any] = ()) -> None:
        super().__init__()
        self._cls = cls
        self.extend(items)

    def _check(self, item: Any) -> Any:
        _check_entry(self._cls, item, f"{self._cls.__qualname__} instance callbacks")
        return item

    def _changed(self) -> None:
        invalidate()

    def append(self, item: Any) -> None:
        with _lock:
            super().append(self._check(item))
            self._changed()

    def extend(self, items: Iterable[Any]) -> None:
        items = [self._check(item) for item in items]
        with _lock:
            super().extend(items)
            self._changed()

    def insert(self, index: Any, item: Any) -> None:
        with _lock:
            super().insert(index, self._check(item))
            self._changed()

    def __iadd__(self, items: Iterable[Any]) -> InstanceCallbackList:  # type: ignore[override, misc]
        self.extend(items)
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        value = [self._check(v) for v in value] if isinstance(index, slice) else self._check(value)
        with _lock:
            super().__setitem__(index, value)
            self._changed()

    def __delitem__(self, index: Any) -> None:
        with _lock:
            super().__delitem__(index)
            self._changed()

    def remove(self, item: Any) -> None:
        with _lock:
            super().remove(item)
            self._changed()

    def pop(self, index: Any = -1) -> Any:
        with _lock:
            item = super().pop(index)
            self._changed()
            return item

    def clear(self) -> None:
        with _lock:
            super().clear()
            self._changed()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        with _lock:
            super().sort(*args, **kwargs)
            self._changed()

    def reverse(self) -> None:
        with _lock:
            super().reverse()
            self._changed()

    def __imul__(self, n: Any) -> InstanceCallbackList:  # type: ignore[override, misc]
        with _lock:
            super().__imul__(n)
            self._changed()
        return self

    def __reduce__(self) -> Any:
        return (InstanceCallbackList, (self._cls, list(self)))


class InstanceHooks(HookState):
    """Per-instance state in ``obj.__dict__``: the instance tier and its chain cache."""

    def __init__(self, cls: type, callbacks: Iterable[Any] = ()) -> None:
        super().__init__()
        self.cls = cls
        with _lock:  # from now on, calls on `cls` instances look for instance state
            if cls not in _stateful_types:
                _stateful_types.add(cls)
                invalidate()
        self.callbacks = InstanceCallbackList(cls, callbacks)
        self.emit_cache: dict[str, Any] = {}

    def __reduce__(self) -> Any:
        # The chain caches are rebuilt after unpickling or copying.
        return (InstanceHooks, (self.cls, list(self.callbacks)))


def instance_state(obj: Any, create: bool = True) -> InstanceHooks | None:
    try:
        namespace = vars(obj)
    except TypeError:
        raise HookError(
            f"{type(obj).__qualname__} instances have no __dict__ (__slots__?), so they cannot "
            f"hold instance callbacks; register on the class instead: "
            f"hookwrap.before({type(obj).__name__}, ...)."
        ) from None
    state = namespace.get(STATE_KEY)
    if state is None and create:
        with _lock:
            state = namespace.get(STATE_KEY)
            if state is None:
                state = namespace[STATE_KEY] = InstanceHooks(type(obj))
                invalidate()
    return state


# --- checking and storing registrations ------------------------------------


def _check_pair(item: Any, where: str, known: Iterable[str] = ()) -> tuple[str, str]:
    """An entry's shape, ``(event, fn)``, and its event name parsed."""
    if not (isinstance(item, tuple) and len(item) == 2):
        raise HookError(
            f"{where}: entries are (event, callback) pairs like ('pre-step', fn), got {item!r}."
        )
    return parse_event(item[0], where, known)


def _check_entry(tp: type, item: Any, where: str) -> tuple[str, str]:
    """Check an ``(event, fn)`` entry for class ``tp``: shape, event, signature."""
    phase, name = _check_pair(item, where, _known_events(tp))
    jp = check_event(tp, phase, name, where)
    if jp is None:
        check_custom_callback(item[1], where, pass_obj=True)
    else:
        spec = spec_of(jp)
        plan_step(item[1], PHASE_CODES[phase], spec, spec.has_obj)
    return phase, name


def check_custom_callback(fn: Any, where: str, pass_obj: bool) -> None:
    """A custom event callback gets keywords by name: no ``*args``/``**kwargs``."""
    import inspect

    if not callable(fn):
        raise HookError(f"{where}: {fn!r} is not callable; register a function.")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    if pass_obj and not params:
        raise HookError(
            f"{where}: callback {callable_label(fn)} takes no `self` parameter; its first "
            f"parameter receives the object that emits the event."
        )
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise HookError(
                f"{where}: callback {callable_label(fn)} takes {'*' if p.kind == p.VAR_POSITIONAL else '**'}"
                f"{p.name}; name the keywords it needs instead."
            )


class Removable:
    """Undone by ``remove()``; also a context manager that removes on exit."""

    __slots__ = ()

    def remove(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class Handle(Removable):
    """What every registration returns: ``remove()`` it (idempotent), or use it as a
    context manager. Registered without a function (``@obj.before("loss")``), it is
    the decorator: applying it registers the function and returns it unchanged."""

    __slots__ = ("_places", "_register", "__weakref__")

    def __init__(self, places: list[tuple[list[Any], Any]],
                 register: Callable[[Any], Handle] | None = None) -> None:
        self._places = places  # (list, entry) pairs this handle removes
        self._register = register

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if self._register is None:
            raise HookError("this handle is already bound to a callback; register a new one.")
        registered = self._register(fn)
        self._places, self._register = registered._places, None
        return fn

    @property
    def active(self) -> bool:
        return any(any(e is entry for e in entries) for entries, entry in self._places)

    def remove(self) -> None:
        with _lock:
            for entries, entry in self._places:
                for i, e in enumerate(entries):
                    if e is entry:
                        del entries[i]
                        break
            invalidate()

    def __repr__(self) -> str:
        state = "active" if self.active else ("pending" if self._register else "removed")
        events = ", ".join(entry[0] for _, entry in self._places)
        return f"<hookwrap.Handle {events or '-'} {state}>"


def _add(entries: list[Any], new: list[Any]) -> Handle:
    """Append entries (under the lock); check their ordering; return their handle."""
    with _lock:
        entries.extend(new)
        try:
            for event in {e[0] for e in new}:
                order_entries([e for e in entries if e[0] == event])  # raises on a cycle
        except HookError:
            for e in new:
                for i, old in enumerate(entries):
                    if old is e:
                        del entries[i]
                        break
            raise
        invalidate()
    return Handle([(entries, e) for e in new])


def _target_label(target: Any) -> str:
    if isinstance(target, type):
        return target.__qualname__
    if isinstance(target, ModuleType):
        return target.__name__
    jp = as_join_point(target)
    if jp is not None:
        return getattr(jp.func, "__qualname__", jp.event)
    return f"{type(target).__qualname__} instance"


def register_entries(target: Any, events: list[tuple[str, Any]], options: Any,
                     where: str) -> Handle:
    """Register ``(event, fn)`` pairs on an instance, a class, a module or a function."""
    jp = as_join_point(target)
    if isinstance(target, ModuleType):
        funcs = {normalize(j.event): j for j in map(as_join_point, vars(target).values()) if j is not None}
        for event, _ in events:
            phase, name = parse_event(event, where)
            if normalize(name) not in funcs:
                raise UnknownEventError(
                    f"{where}: module {target.__name__} has no join point {name!r}."
                    + closest(name, [j.event for j in funcs.values()])
                    + " Make the function hookable with @hookwrap.hookable or hookwrap.weave()."
                )
        handles = [register_entries(funcs[normalize(parse_event(e, where)[1])], [(e, f)], options, where)
                   for e, f in events]
        return Handle([p for h in handles for p in h._places])
    if jp is not None and jp.binding == FUNCTION and jp.owner is None:
        spec = spec_of(jp)
        for event, fn in events:
            phase, name = parse_event(event, where)
            if phase == CUSTOM or normalize(name) != normalize(jp.event):
                raise UnknownEventError(
                    f"{where}: the join point {jp.event!r} has no event {event!r}; its events are "
                    + ", ".join(f"'{p}-{jp.event}'" for p in PHASES) + "."
                )
            plan_step(fn, PHASE_CODES[phase], spec, spec.has_obj)
        entries = _function_registrations.setdefault(jp, [])
        return _add(entries, [Registration(e, f, options) for e, f in events])
    if jp is not None:  # a method join point: its class
        target = jp.owner
    if isinstance(target, type):
        for event, fn in events:
            _check_entry(target, (event, fn), where)
        return _add(_class_registrations.setdefault(target, []),
                    [Registration(e, f, options) for e, f in events])
    state = instance_state(target)
    assert state is not None
    return _add(state.callbacks, [Registration(e, f, options) for e, f in events])


def register(target: Any, phase: str, event: Any, fn: Any, opts: dict[str, Any]) -> Handle:
    """``before``/``after``/``around``/``on_error``/``on``: one callback on a target."""
    verb = {"pre": "before", "post": "after", "around": "around", "error": "on_error", CUSTOM: "on"}[phase]
    where = f"{verb}({_target_label(target)}, {event!r})"
    if not isinstance(event, str):
        raise HookError(f"{where}: the event must be a string, got {type(event).__name__}.")
    if phase == CUSTOM:
        if "-" in event:
            raise HookError(f"{where}: on() takes a custom event name like 'on_fit_end', got {event!r}.")
    elif event.partition("-")[0] in PHASE_CODES and "-" in event:
        raise HookError(
            f"{where}: {verb}() takes a join point name like 'step', got {event!r}. "
            f"Pass the join point, not the event."
        )
    options = make_options(where, **opts)
    if fn is None:
        return Handle([], lambda f: register(target, phase, event, f, opts))
    full = event if phase == CUSTOM else f"{phase}-{event}"
    return register_entries(target, [(full, fn)], options, where)


def register_global(events: list[tuple[str, Any]], options: Any, where: str) -> Handle:
    """Global tier: checked against every join point of that event known now."""
    for event, fn in events:
        phase, name = parse_event(event, where)
        if phase == CUSTOM:
            check_custom_callback(fn, where, pass_obj=True)
            continue
        matching = [jp for jp in list(_all_join_points) if normalize(jp.event) == normalize(name)]
        if not matching:
            known = sorted({f"{p}-{jp.event}" for jp in list(_all_join_points) for p in PHASES})
            raise UnknownEventError(
                f"{where}: no join point {name!r} exists." + closest(event, known)
                + " Define or import the hookable code before registering a global callback for it."
            )
        for jp in matching:
            spec = spec_of(jp)
            plan_step(fn, PHASE_CODES[phase], spec, spec.has_obj)
    return _add(_global_registrations, [Registration(e, f, options) for e, f in events])


# --- classes ------------------------------------------------------------------


class ClassCallbacksAttribute:
    """Base of the descriptor that serves ``obj.callbacks`` (see mixin)."""


_ABSENT = object()


def prepare_class(cls: type) -> None:
    """Run on every Hookable subclass at creation: capture its ``callbacks`` list,
    keep overrides of join points hookable, and check its class tier now."""
    with _lock:
        _prepared.add(cls)
        declared = vars(cls).get("callbacks", _ABSENT)
        if declared is not _ABSENT and not isinstance(declared, ClassCallbacksAttribute):
            _declared[cls] = _parse_declared(cls, declared)
            delattr(cls, "callbacks")  # the per-instance descriptor serves it now
        _keep_overrides_hookable(cls)
        invalidate()
        # A class with join points of its own is checked now, so a typo fails at
        # its definition. A mixin (only the inherited `init`) may name events of
        # classes it will be mixed into: it is checked when first instantiated.
        if set(join_points(cls)) - {"init"}:
            check_class_tier(cls)


def _parse_declared(cls: type, declared: Any) -> tuple[tuple[str, Any], ...] | None:
    if declared is None:
        return None
    where = f"{cls.__qualname__}.callbacks"
    if not isinstance(declared, (list, tuple)):
        raise HookError(f"{where} must be a list of (event, callback) pairs, got {declared!r}.")
    for item in declared:
        _check_pair(item, where)
    return tuple(declared)


def declared_callbacks(cls: Any) -> list[tuple[str, Any]]:
    """The entries ``cls`` itself declared in its ``callbacks`` list."""
    return list(_declared.get(cls) or ())


def _keep_overrides_hookable(cls: type) -> None:
    for name, value in list(vars(cls).items()):  # name first: __set_name__ may not have
        jp = as_join_point(value)
        if jp is not None and jp.owner is None:
            name_join_point(value, cls, name)
    for name, value in list(vars(cls).items()):
        inherited = None
        for base in cls.__mro__[1:]:
            if name in vars(base):
                inherited = as_join_point(vars(base)[name])
                break
        if inherited is None:
            continue
        own = as_join_point(value)
        if own is not None:
            if not own.explicit_event:  # an override keeps the event name it overrides
                own.event = inherited.event
        elif isinstance(value, FunctionType):
            from .hookable import make_join_point  # (hookable imports this module)

            attribute = make_join_point(value, inherited.event)
            jp = as_join_point(attribute)
            jp.explicit_event = inherited.explicit_event
            setattr(cls, name, attribute)
            name_join_point(attribute, cls, name)


def check_class_tier(cls: type) -> None:
    """Check every class-tier callback of ``cls``: its event exists, its signature fits."""
    for entry in _class_entries(cls):
        where = f"{cls.__qualname__} ({entry.origin})"
        jp = check_event(cls, entry.phase, entry.event, where)
        if jp is None:
            check_custom_callback(entry.fn, where, pass_obj=True)
        else:
            spec = spec_of(jp)
            plan_step(entry.fn, PHASE_CODES[entry.phase], spec, spec.has_obj)


set_resolvers(resolve_type, resolve_instance, run_chain_async)
