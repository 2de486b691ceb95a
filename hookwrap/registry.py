"""Where callbacks are registered, and how they become the chain a call runs.

Tiers, in the order they run for one event on one object:

1. class tier: for each class of the MRO from base to most derived, its
   declared ``callbacks`` list, then its ``{pre|post}_<event>_callback`` methods;
2. instance tier: ``obj.callbacks`` (what ``obj.before``/``obj.after`` append to).

Chains are built here, in pure Python, on a cache miss; the dispatch module
caches them per class (on the join point) and per instance (``HookState``),
and one global version counter (``invalidate``) marks every cache stale when
anything is registered or removed. A call never sees a half-built chain: it
runs the tuple it read at its start (snapshot semantics).
"""

from __future__ import annotations

import functools
import threading
import weakref
from types import FunctionType
from typing import Any, Callable, Iterable

from ._dispatch import (
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
from .events import callback_method_event, normalize, split_event
from .signature import JoinPointSpec, plan_step

__all__ = [
    "ClassCallbacksAttribute",
    "Handle",
    "InstanceHooks",
    "InstanceCallbackList",
    "as_join_point",
    "declared_callbacks",
    "find_join_point",
    "instance_state",
    "join_points",
    "prepare_class",
    "register_on_instance",
]

_lock = threading.RLock()
_PHASES = {"pre": PRE, "post": POST}

# class -> its declared `callbacks` entries, as written: (("pre-step", fn), ...);
# None when the class sets `callbacks = None` (drop the inherited lists).
_declared: weakref.WeakKeyDictionary[type, tuple[tuple[str, Any], ...] | None] = (
    weakref.WeakKeyDictionary()
)
_specs: dict[Any, JoinPointSpec] = {}
_checked: weakref.WeakSet[type] = weakref.WeakSet()  # classes whose class tier passed
_join_point_cache: weakref.WeakKeyDictionary[type, tuple[int, dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


# --- join points ------------------------------------------------------------


def as_join_point(value: Any) -> Any:
    """The JoinPoint behind a class attribute (or None): bare, or inside a wrapt wrapper."""
    if type(value) is JoinPoint:
        return value
    jp = getattr(type(value), "_hookwrap_join_point", None)
    return value._self_join_point if jp is not None else None


def join_points(tp: type) -> dict[str, Any]:
    """Normalized event name -> the most derived join point of that event on ``tp``."""
    version = current_version()
    cached = _join_point_cache.get(tp)
    if cached is not None and cached[0] == version:
        return cached[1]
    found: dict[str, Any] = {}
    for klass in tp.__mro__:
        for value in vars(klass).values():
            jp = as_join_point(value)
            if jp is not None:
                found.setdefault(normalize(jp.event), jp)
    _join_point_cache[tp] = (version, found)
    return found


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


# --- the class tier -----------------------------------------------------------


def _class_entries(tp: type) -> list[tuple[int, str, Any, str]]:
    """(phase, normalized event, fn, origin) of the class tier, base class first."""
    entries: list[tuple[int, str, Any, str]] = []
    for klass in reversed(tp.__mro__):
        if klass in _declared:
            declared = _declared[klass]
            if declared is None:  # `callbacks = None`: drop the inherited lists
                entries = [e for e in entries if not e[3].startswith("list:")]
            else:
                entries.extend(
                    (phase, event, fn, f"list:{klass.__qualname__}")
                    for phase, event, fn in _parse_entries(declared)
                )
        for attr, value in vars(klass).items():
            parsed = callback_method_event(attr)
            if parsed is None:
                continue
            origin = f"method:{attr}"
            if value is None:  # `pre_step_callback = None` drops the inherited one
                entries = [e for e in entries if e[3] != origin]
                continue
            if not isinstance(value, FunctionType):
                raise HookError(
                    f"{klass.__qualname__}.{attr} looks like a callback method but is a "
                    f"{type(value).__name__}; define it as a plain method `def {attr}(self, ...)`."
                )
            entries.append((_PHASES[parsed[0]], normalize(parsed[1]), value, origin))
    return entries


def _plan(jp: Any, entries: Iterable[tuple[int, Any]]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    spec = spec_of(jp)
    pass_obj = spec.has_obj
    pre, post = [], []
    for phase, fn in entries:
        (pre if phase == PRE else post).append(plan_step(fn, phase, spec, pass_obj))
    return tuple(pre), tuple(post)


def _class_chain_entries(jp: Any, tp: Any) -> list[tuple[int, Any]]:
    if not isinstance(tp, type):
        return []
    event = normalize(jp.event)
    return [(phase, fn) for phase, ev, fn, _ in _class_entries(tp) if ev == event]


def resolve_type(jp: Any, tp: Any) -> Any:
    """The chain of ``jp`` for instances of ``tp`` (class tier). Cached on ``jp``."""
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
            pre, post = _plan(jp, _class_chain_entries(jp, tp))
            chain = Chain(tp, version, True, pre, post)
        jp.chains[tp] = chain
        return chain


def resolve_instance(state: InstanceHooks, jp: Any, type_chain: Any) -> Any:
    """The chain of ``jp`` for one instance: class tier, then instance tier."""
    with _lock:
        version = current_version()
        event = normalize(jp.event)
        own = [(phase, fn) for phase, ev, fn in state.callbacks.parsed() if ev == event]
        pre, post = _plan(jp, own)
        return Chain(type_chain.tp, version, True, type_chain.pre + pre, type_chain.post + post)


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
        where = f"{self._cls.__qualname__} instance callbacks"
        phase, event = _check_entry(item, where)
        jp = find_join_point(self._cls, event, where)
        plan_step(item[1], _PHASES[phase], spec_of(jp), spec_of(jp).has_obj)
        return item

    def parsed(self) -> list[tuple[int, str, Any]]:
        return _parse_entries(self)

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

    def __iadd__(self, items: Iterable[Any]) -> InstanceCallbackList:  # type: ignore[override]
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

    def __imul__(self, n: Any) -> InstanceCallbackList:  # type: ignore[override]
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
        self.callbacks = InstanceCallbackList(cls, callbacks)

    def __reduce__(self) -> Any:
        # The chain cache is rebuilt after unpickling or copying.
        return (InstanceHooks, (self.cls, list(self.callbacks)))


def instance_state(obj: Any, create: bool = True) -> InstanceHooks | None:
    try:
        namespace = vars(obj)
    except TypeError:
        raise HookError(
            f"{type(obj).__qualname__} instances have no __dict__ (__slots__?), so they cannot "
            f"hold instance callbacks; register on the class instead."
        ) from None
    state = namespace.get(STATE_KEY)
    if state is None and create:
        with _lock:
            state = namespace.get(STATE_KEY)
            if state is None:
                state = namespace[STATE_KEY] = InstanceHooks(type(obj))
                invalidate()
    return state


class Handle:
    """What every registration returns: ``remove()`` it (idempotent), or use it as a
    context manager. Registered without a function (``@obj.before("loss")``), it is
    the decorator: applying it registers the function and returns it unchanged."""

    __slots__ = ("_entries", "_entry", "_register")

    def __init__(self, entries: list[Any] | None, entry: Any,
                 register: Callable[[Any], Handle] | None = None) -> None:
        self._entries = entries
        self._entry = entry
        self._register = register

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if self._register is None:
            raise HookError("this handle is already bound to a callback; register a new one.")
        registered = self._register(fn)
        self._entries, self._entry, self._register = registered._entries, registered._entry, None
        return fn

    @property
    def active(self) -> bool:
        return self._entries is not None and any(e is self._entry for e in self._entries)

    def remove(self) -> None:
        entries = self._entries
        if entries is None:
            return
        with _lock:
            for i, entry in enumerate(entries):
                if entry is self._entry:
                    del entries[i]
                    break

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "active" if self.active else ("pending" if self._register else "removed")
        return f"<hookwrap.Handle {self._entry!r} {state}>"


def register_on_instance(obj: Any, phase: str, event: str, fn: Callable[..., Any] | None) -> Handle:
    """``obj.before(event, fn)`` / ``obj.after(event, fn)``."""
    if not isinstance(event, str) or event.partition("-")[0] in _PHASES and "-" in event:
        raise HookError(
            f"{type(obj).__qualname__}.{'before' if phase == 'pre' else 'after'}() takes a join "
            f"point name like 'step', got {event!r}. Pass the join point, not the event."
        )
    if fn is None:
        return Handle(None, None, lambda f: register_on_instance(obj, phase, event, f))
    state = instance_state(obj)
    assert state is not None
    entry = (f"{phase}-{event}", fn)
    state.callbacks.append(entry)
    return Handle(state.callbacks, entry)


# --- classes ------------------------------------------------------------------


def prepare_class(cls: type) -> None:
    """Run on every Hookable subclass at creation: capture its ``callbacks`` list,
    keep overrides of join points hookable, and check its class tier now."""
    with _lock:
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


_ABSENT = object()


class ClassCallbacksAttribute:
    """Marker base for the descriptor that serves ``obj.callbacks`` (see mixin)."""


def _parse_declared(cls: type, declared: Any) -> tuple[tuple[str, Any], ...] | None:
    if declared is None:
        return None
    where = f"{cls.__qualname__}.callbacks"
    if not isinstance(declared, (list, tuple)):
        raise HookError(f"{where} must be a list of (event, callback) pairs, got {declared!r}.")
    for item in declared:
        _check_entry(item, where)
    return tuple(declared)


def _check_entry(item: Any, where: str) -> tuple[str, str]:
    """An ``(event, fn)`` entry's shape; returns ``(phase, join point name)``."""
    if not (isinstance(item, tuple) and len(item) == 2):
        raise HookError(
            f"{where}: entries are (event, callback) pairs like ('pre-step', fn), got {item!r}."
        )
    return split_event(item[0], where)


def _parse_entries(entries: Iterable[tuple[str, Any]]) -> list[tuple[int, str, Any]]:
    out = []
    for event, fn in entries:
        phase, name = event.split("-", 1)
        out.append((_PHASES[phase], normalize(name), fn))
    return out


def declared_callbacks(cls: Any) -> list[tuple[str, Any]]:
    """The entries ``cls`` itself declared in its ``callbacks`` list."""
    return list(_declared.get(cls) or ())


def _keep_overrides_hookable(cls: type) -> None:
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
            jp = JoinPoint(value, inherited.event, METHOD)
            functools.update_wrapper(jp, value)
            jp.explicit_event = inherited.explicit_event
            setattr(cls, name, jp)
            jp.__set_name__(cls, name)


def check_class_tier(cls: type) -> None:
    """Check every class-tier callback of ``cls``: its event exists, its signature fits."""
    known = join_points(cls)
    for phase, event, fn, origin in _class_entries(cls):
        where = f"{cls.__qualname__} ({origin.replace(':', ' ')})"
        jp = find_join_point(cls, event, where) if event not in known else known[event]
        spec = spec_of(jp)
        plan_step(fn, phase, spec, spec.has_obj)


set_resolvers(resolve_type, resolve_instance, run_chain_async)
