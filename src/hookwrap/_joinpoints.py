"""The join points of a class, and what may be registered on them.

Finding join points: naming those Python did not name, finding them on a class
(cached in its record), every join point known (for a global callback's check).
Registration-time checks against them: an entry's shape, that its event exists,
that the callback's signature fits (a ``Step`` planned once, kept on the entry),
and that a callback meant to be saved with its object pickles.
"""

from __future__ import annotations

import functools
import sys
import weakref
from types import FunctionType, MethodType, ModuleType
from typing import Any, Iterable, Iterator

from ._dispatch import JoinPoint, join_point_of
from ._entries import CUSTOM, PHASES, Registration, normalize, parse_event
from ._owners import class_record, function_record, is_builtin_type, lock, with_subclasses
from ._policy import AROUND, ERROR, FUNCTION, METHOD, POST, PRE
from ._signature import (
    JoinPointSpec,
    callable_label,
    callback_parameters,
    for_join_point,
    plan_step,
)
from .errors import CallbackSignatureError, HookError, UnknownEventError, closest, safe_repr

__all__ = [
    "PHASE_CODES",
    "all_join_points",
    "check_custom_callback",
    "check_entry",
    "check_event",
    "check_pair",
    "check_registration",
    "declared_custom_events",
    "find_join_point",
    "find_owner",
    "fires",
    "fitting_step",
    "has_join_points",
    "join_points",
    "known_events",
    "name_join_point",
    "pickle_problem",
    "planned_step",
    "spec_of",
    "target_join_points",
    "track_join_point",
]


# --- Finding join points ---------------------------------------------------------

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


# --- Checking a registration against them ----------------------------------------

PHASE_CODES = {"pre": PRE, "post": POST, "around": AROUND, "error": ERROR}


def check_pair(item: Any, where: str, known: Iterable[str] = ()) -> Registration:
    """An ``(event, fn)`` entry as a Registration (its event parsed once)."""
    if isinstance(item, Registration):
        return item
    if not (isinstance(item, tuple) and len(item) == 2):
        raise HookError(
            f"{where}: entries are (event, callback) pairs like ('pre-step', fn), got {safe_repr(item)}."
        )
    return Registration(item[0], item[1], None, parse_event(item[0], where, known))


def check_event(tp: type, phase: str, name: str, where: str) -> Any:
    """Check that ``tp`` has this event; returns its join point (None for custom events)."""
    if phase != CUSTOM:
        jp = find_join_point(tp, name, where)
        if not fires(jp, tp):
            # A class that overrides a woven method with a plain one (a Hookable
            # subclass's overrides stay hookable): its calls never reach the join point.
            owner = jp.owner.__qualname__ if jp.owner is not None else "its base"
            raise HookError(
                f"{where}: {tp.__qualname__} overrides {jp.attr_name}() of {owner}, where it was "
                f"made hookable, so callbacks of {name!r} would never run for it. Weave the "
                f"override too: hookwrap.weave({tp.__qualname__}, {jp.attr_name!r})."
            )
        return jp
    if name not in declared_custom_events(tp):
        raise UnknownEventError(
            f"{where}: {tp.__qualname__} declares no custom event {name!r}."
            + closest(name, known_events(tp))
            + f" Declare it in the class: `emits = ({name!r},)`."
        )
    return None


def check_entry(tp: type, item: Any, where: str) -> Registration:
    """Check an ``(event, fn)`` entry for class ``tp``: shape, event, signature."""
    registration = check_pair(item, where, _known_on_demand(tp))
    check_registration(tp, registration, where)
    return registration


def _known_on_demand(tp: type) -> Iterator[str]:
    """The events of ``tp``, computed only if an error lists the closest ones."""
    yield from known_events(tp)


def check_registration(tp: type, registration: Registration, where: str) -> None:
    """Check a parsed entry against class ``tp``: its event exists, its callback fits."""
    jp = check_event(tp, registration.phase, registration.name, where)
    if jp is None:
        check_custom_callback(registration.fn, where, pass_obj=True)
    else:
        planned_step(registration, spec_of(jp))


def planned_step(registration: Registration, spec: JoinPointSpec) -> Any:
    """The dispatch Step of ``registration`` on the join point of ``spec``: its
    signature is read once (raising CallbackSignatureError if it does not fit),
    and the Step kept on the registration, weakly keyed by the join point."""
    steps = registration.steps
    if steps is None:
        steps = registration.steps = weakref.WeakKeyDictionary()
    step = steps.get(spec)
    if step is None:
        options = registration.options
        fn = for_join_point(registration.fn, spec)
        step = steps[spec] = plan_step(fn, PHASE_CODES[registration.phase], spec,
                                       spec.has_obj, options.gate if options is not None else None)
    if type(step) is _Unfit:
        raise step.error.with_traceback(None)
    return step


class _Unfit:
    """planned_step's record of a join point a global callback does not fit."""

    __slots__ = ("error",)

    def __init__(self, error: CallbackSignatureError) -> None:
        self.error = error


def fitting_step(registration: Registration, spec: JoinPointSpec) -> Any:
    """A global registration's Step on this join point, or None where it does not fit
    (the global tier reaches every join point of its event's name, in unrelated
    classes; it runs where its signature fits). Decided once per join point."""
    try:
        return planned_step(registration, spec)
    except CallbackSignatureError as exc:
        # Without its traceback, whose frames hold ``spec`` (the weak key) alive.
        registration.steps[spec] = _Unfit(exc.with_traceback(None))
        return None


def check_custom_callback(fn: Any, where: str, pass_obj: bool) -> None:
    """A custom event callback gets keywords by name: no ``*args``/``**kwargs``."""
    if not callable(fn):
        raise HookError(f"{where}: the callback {safe_repr(fn)} is not callable; register a function.")
    try:
        params = callback_parameters(fn)
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


def pickle_problem(fn: Any) -> str | None:
    """Why pickle cannot save ``fn`` (it saves a function by its module and name),
    or None when it can, or cannot tell (a callable object: pickle decides)."""
    if isinstance(fn, functools.partial):
        return pickle_problem(fn.func)
    if isinstance(fn, MethodType) or not isinstance(fn, FunctionType):
        return None  # a bound method saves its object; other callables, themselves
    qualname = fn.__qualname__
    if "<lambda>" in qualname:
        return "a lambda"
    if "<locals>" in qualname:
        return "a function defined inside another function"
    found: Any = sys.modules.get(fn.__module__)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not fn:
        return f"not found as {fn.__module__}.{qualname}"
    return None
