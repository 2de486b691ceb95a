"""Join points: naming them, finding them on a class, reading their parameters."""

from __future__ import annotations

import weakref
from types import FunctionType, ModuleType
from typing import Any

from ._dispatch import JoinPoint, join_point_of
from ._policy import FUNCTION, METHOD
from ._owners import class_record, function_record, is_builtin_type, lock, with_subclasses
from .errors import HookError, UnknownEventError, closest
from ._events import PHASES, normalize
from ._signature import JoinPointSpec

__all__ = [
    "all_join_points",
    "declared_custom_events",
    "find_join_point",
    "find_owner",
    "fires",
    "has_join_points",
    "join_points",
    "known_events",
    "name_join_point",
    "spec_of",
    "target_join_points",
    "track_join_point",
]

# Every join point, weakly: a global callback is checked against those of its event.
_all_join_points: weakref.WeakSet[Any] = weakref.WeakSet()


def all_join_points() -> list[Any]:
    return list(_all_join_points)


def track_join_point(jp: Any) -> Any:
    _all_join_points.add(jp)
    return jp


def name_join_point(value: Any, owner: type, name: str) -> None:
    """``__set_name__`` for a join point that Python did not name: stored in a class
    after its creation, inside a classmethod/staticmethod, or (pure twin) stored as
    its dispatch function."""
    jp = join_point_of(value)
    if jp is None:
        return
    if type(value) is JoinPoint:
        value.__set_name__(owner, name)
        return
    jp.owner, jp.attr_name = owner, name
    if not jp.explicit_event:
        jp.event = name
    if type(value) is FunctionType and jp.binding == FUNCTION:
        jp.rebind(METHOD)  # a plain function in a class body: an instance method
        # Called before now (pure twin, a class that is not Hookable), it ran as a
        # function: what was planned for that reads `self` as an argument.
        jp.spec = None
        jp.forget_last_chain()
        if jp.record is not None:
            function_record(jp).changed(None)
        jp.planner.named(jp, owner, name)  # as the compiled twin's __set_name__ does


def find_owner(jp: Any) -> tuple[type, str] | None:
    """The class and attribute holding ``jp`` where nothing named it: the pure twin
    stores a join point as a plain function, which Python names in no class
    (``__set_name__``), and a class that is not ``Hookable`` does not scan itself.
    Found by the function's ``__qualname__`` (``Plain.step``: defined in a class
    body), for a registration through the attribute (``Plain.step.before(fn)``);
    None for a plain function. Walks the classes once per join point: only until
    it is named."""
    qualname = getattr(jp.func, "__qualname__", "")
    owner_name = qualname.rpartition(".")[0]
    if not owner_name or owner_name.endswith("<locals>"):
        return None  # a module's function, or one defined inside a function
    module = getattr(jp.func, "__module__", None)
    for klass in with_subclasses(object):
        if klass.__qualname__ != owner_name or klass.__module__ != module or is_builtin_type(klass):
            continue
        for attr, value in list(vars(klass).items()):
            if join_point_of(value) is jp:
                return klass, attr
    return None


def join_points(tp: type) -> dict[str, Any]:
    """Normalized event name -> the most derived join point of that event on ``tp``.
    Cached in ``tp``'s record; weaving (``changed_class(structure=True)``) clears it."""
    try:
        record = class_record(tp)
    except HookError:  # a built-in type: nothing to cache on, and nothing to find
        return _scan(tp)
    assert record is not None
    found = record.join_points
    if found is None:
        found = _scan(tp)
        record.join_points = found
    return found


def has_join_points(tp: type) -> bool:
    """Does ``tp`` have any join point? Asked without keeping a record on ``tp``."""
    if class_record(tp, create=False) is not None:
        return bool(join_points(tp))
    return any(join_point_of(value) is not None for klass in tp.__mro__ for value in list(vars(klass).values()))


def _scan(tp: type) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with lock:
        for klass in tp.__mro__:
            for attr, value in list(vars(klass).items()):
                jp = join_point_of(value)
                if jp is not None:
                    if jp.owner is None:
                        name_join_point(value, klass, attr)
                    found.setdefault(normalize(jp.event), jp)
                    continue
                jp = join_point_of(value, through_wrappers=True)
                if jp is not None and jp.attr_name == attr and jp.owner is not None \
                        and issubclass(tp, jp.owner):
                    # A method join point its class (or a library) wrapped again in
                    # place (functools.wraps): still this class's join point. A wrapper
                    # of any other join point is only a function calling it.
                    found.setdefault(normalize(jp.event), jp)
    return found


def target_join_points(target: Any) -> dict[str, Any]:
    """Normalized event name -> join point, for what a callback object attaches to:
    a class (its join points), a hookable function (itself), a module (its hookable
    functions), or an instance (its class's)."""
    if isinstance(target, ModuleType):
        found = (join_point_of(value) for value in list(vars(target).values()))
        return {normalize(jp.event): jp for jp in found if jp is not None and jp.owner is None}
    jp = join_point_of(target)
    if jp is not None and jp.owner is None:
        return {normalize(jp.event): jp}
    return join_points(target if isinstance(target, type) else type(target))


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


def known_events(tp: type) -> list[str]:
    """Every event of ``tp``: each phase of each join point, then its custom events."""
    events = [f"{p}-{jp.event}" for jp in join_points(tp).values() for p in PHASES]
    return events + sorted(declared_custom_events(tp))


def find_join_point(tp: type, name: str, where: str) -> Any:
    """The join point named ``name`` on ``tp``, or UnknownEventError with the closest names."""
    jp = join_points(tp).get(normalize(name))
    record = class_record(tp, create=False)
    if jp is None and record is not None:
        # A join point set on the class after its first lookup (not by weave): look again.
        record.join_points = None
        jp = join_points(tp).get(normalize(name))
    if jp is None:
        known = sorted({jp.event for jp in join_points(tp).values()})
        raise UnknownEventError(
            f"{where}: {tp.__qualname__} has no join point {name!r}."
            + closest(name, known)
            + f" Join points of {tp.__qualname__}: {', '.join(known) or '(none)'}. "
            f"Make the method hookable with @hookwrap.hookable, or, in code you cannot edit, "
            f"hookwrap.weave({tp.__name__}, {name!r})."
        )
    return jp


def spec_of(jp: Any) -> JoinPointSpec:
    """The join point's parameters, read once (again if its event was renamed)."""
    spec = jp.spec
    if spec is None or spec.event != jp.event:
        spec = jp.spec = JoinPointSpec(jp)
    return spec  # type: ignore[no-any-return]


def fires(jp: Any, tp: Any) -> bool:
    """False when ``tp`` overrides this join point: the call is a ``super()`` call
    from inside the override, whose callbacks already ran."""
    name = jp.attr_name
    if name is None or not isinstance(tp, type):
        return True
    for klass in tp.__mro__:
        if name in vars(klass):
            return join_point_of(vars(klass)[name], through_wrappers=True) is jp
    return True
