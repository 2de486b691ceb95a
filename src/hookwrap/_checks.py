"""Checks made when a callback is registered: the entry's shape, that its event
exists, that its signature fits the join point. Each error names the callback,
the place and the fix."""

from __future__ import annotations

import functools
import sys
import weakref
from types import FunctionType, MethodType
from typing import Any, Iterable, Iterator

from ._policy import AROUND, ERROR, POST, PRE
from ._joinpoints import declared_custom_events, find_join_point, fires, known_events, spec_of
from .errors import CallbackSignatureError, HookError, UnknownEventError, closest, safe_repr
from ._reader import for_join_point
from ._events import CUSTOM, parse_event
from ._options import Registration
from ._signature import JoinPointSpec, callable_label, callback_parameters, plan_step

__all__ = [
    "PHASE_CODES",
    "check_custom_callback",
    "check_entry",
    "check_event",
    "check_pair",
    "check_registration",
    "fitting_step",
    "pickle_problem",
    "planned_step",
]

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
