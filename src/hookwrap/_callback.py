"""Class-based callbacks (Lightning / pytorch-accelerated / Cerebras style).

A ``Callback`` subclass defines methods named after events, ``-`` written as
``_``: ``pre_loss(self, trainer, batch)``, ``post_step(self, trainer,
return_value)``, ``around_step(self, trainer, proceed, *args, **kwargs)``,
``error_step(self, trainer, exception)``, ``on_validation_end(self, trainer,
metrics)``. Each follows the rules of function callbacks. A method whose name
looks like an event but matches none is refused with the closest names: none
of the libraries hookwrap replaces catches such typos, they never fire.
"""

from __future__ import annotations

import functools

import threading
from types import ModuleType
from typing import Any, Callable

from ._dispatch import join_point_of
from ._lifecycle import Defers, is_boundary, settling
from ._joinpoints import all_join_points, declared_custom_events, target_join_points
from ._registration import Handle, register_entries, register_global
from .errors import CallbackSignatureError, HookError, UnknownEventError, closest, safe_repr
from ._entries import CUSTOM, PHASES, callback_object_event, normalize, parse_event
from ._entries import Options, Registration, make_options
from ._joinpoints import READER_PHASE_ATTR

__all__ = ["Callback", "NotACallbackError", "add_callback", "callback_events", "register_global_callback"]

class NotACallbackError(HookError, TypeError):
    """``add_callback``/``register_global_callback`` given something that is not a
    ``Callback`` (nor, for the global tier, an ``("event", fn)`` pair). A TypeError
    too, as it always was."""


_blocks_lock = threading.RLock()  # a Callback's `with` blocks (an RLock: registering may re-enter)


class Callback:
    """Base class of class-based callbacks; also a context manager that registers
    the callback globally for the duration of a ``with`` block."""

    _hookwrap_handle: Handle | None = None
    # True: every event method fires only in the process of rank 0 (torch.distributed),
    # as if registered with rank_zero_only=True. For callbacks that only print or write.
    rank_zero_only: bool = False

    def event_methods(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        """The ``(event, callable)`` pairs this callback registers when attached to
        objects of class ``target``, to a hookable function or a module of them
        (``None``: the global tier).

        By default, its methods named after events (``post_loss`` -> ``"post-loss"``).
        Override it to choose events when attached: hookwrap.torch's callbacks
        attach to the events named in their constructor, and check them against
        ``target`` here, so a bad name fails at attach time, with what
        ``hookwrap.extend`` offers (``join_points``, ``reader``, ``per_join_point``).
        """
        return [(_event_string(phase, name), method)
                for _, phase, name, method in callback_events(self)]

    @property
    def state_key(self) -> str:
        """Names this callback's entry in ``hookwrap.callback_state(obj)``. The class
        name by default; callbacks that may be attached twice with different settings
        add those (``EarlyStopping[monitor=val_loss,mode=min]``)."""
        return type(self).__qualname__

    # How many `with` blocks of this callback are open (any thread): registered once
    # while one is, removed when the last closes. Nested and concurrent blocks nest.
    _hookwrap_blocks: int = 0

    def __enter__(self) -> Callback:
        with _blocks_lock:
            if not self._hookwrap_blocks:
                self._hookwrap_handle = register_global_callback(self)
            self._hookwrap_blocks += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with _blocks_lock:
            if not self._hookwrap_blocks:
                return  # an exit without its enter: nothing of this block is registered
            self._hookwrap_blocks -= 1
            if self._hookwrap_blocks:
                return
            handle, self._hookwrap_handle = self._hookwrap_handle, None
            # Removed under the lock: a block another thread opens right after this
            # one closed must not register while this registration is still live
            # (a call in between would run the callback twice).
            if handle is not None:
                handle.remove()


def callback_events(cb: Callback) -> list[tuple[str, str, str, Any]]:
    """``(attribute, phase, event name, bound method)`` for each event method of ``cb``,
    base class first, in definition order."""
    seen: set[str] = set()
    out = []
    for klass in reversed(type(cb).__mro__):
        if klass in (Callback, object):
            continue
        for attr in vars(klass):
            if attr in seen or attr.startswith("_"):
                continue
            parsed = callback_object_event(attr)
            if parsed is None:
                continue
            seen.add(attr)
            if _class_level_partial(cb, attr):
                raise HookError(
                    f"{type(cb).__qualname__}.{attr} is a functools.partial in the class body, which "
                    f"Python 3.13 warns about and later versions bind like a method (passing the callback "
                    f"object). Define `def {attr}(self, ...)`, or wrap it: {attr} = staticmethod(partial(...))."
                )
            method = getattr(cb, attr)  # the most derived definition
            if method is None:  # a subclass turning its base's event method off
                continue
            if not callable(method):
                raise HookError(
                    f"{type(cb).__qualname__}.{attr} is named like an event method but is a "
                    f"{type(method).__name__} ({safe_repr(method)}), not a method. Define `def {attr}(self, ...)`, "
                    f"or give the attribute a name without a pre_/post_/around_/error_/on_ prefix."
                )
            out.append((attr, parsed[0], parsed[1], method))
    return out


def _class_level_partial(cb: Any, attr: str) -> bool:
    """Is ``attr`` of ``cb`` a ``functools.partial`` its class holds (not one set on the object)?"""
    if attr in getattr(cb, "__dict__", ()):
        return False
    for klass in type(cb).__mro__:
        if attr in vars(klass):
            return type(vars(klass)[attr]) is functools.partial
    return False


def _event_string(phase: str, name: str) -> str:
    return name if phase == CUSTOM else f"{phase}-{name}"


def _unknown(cb: Callback, attr: str, known_events: list[str], where: str) -> UnknownEventError:
    method_names = [e.replace("-", "_") for e in known_events]
    return UnknownEventError(
        f"{where}: {type(cb).__qualname__}.{attr} looks like an event method, but no such event "
        f"exists." + closest(attr, method_names)
        + " Rename it to match an event, or give helper methods a name without a "
        "pre_/post_/around_/error_/on_ prefix."
    )


def add_callback(target: Any, cb: Callback, /, **options: Any) -> Handle:
    """Register each event method of ``cb`` on one object (an instance of a hookable or
    woven class), a class (all its instances), a hookable function or a module (its
    hookable functions), each with the registration ``options`` (its own filter
    state); one handle removes them all."""
    where = f"add_callback({type(cb).__qualname__})"
    if not isinstance(cb, Callback):
        raise NotACallbackError(f"{where}: expected a hookwrap.Callback instance, got {type(cb).__qualname__}. "
                                f"Pass an instance of a hookwrap.Callback subclass (its event methods are "
                                f"registered), or register a function with hookwrap.before/after/around.")
    make_options(where, **options)  # a bad option fails before anything is registered
    handle = register_entries(target, _resolve_names(cb, _attach_target(target), where, options), where)
    return settling(handle, cb, target)


def _attach_target(target: Any) -> Any:
    """What ``event_methods`` is asked about: the class for an instance or a class,
    else the hookable function or module itself."""
    if isinstance(target, (type, ModuleType)):
        return target
    jp = join_point_of(target)
    if jp is not None and jp.owner is None:
        return target
    return type(target)


def _resolve_names(cb: Callback, target: Any, where: str, options: dict[str, Any]) -> list[Registration]:
    jps = target_join_points(target)
    custom = declared_custom_events(target) if isinstance(target, type) else set()
    known = [f"{p}-{jp.event}" for jp in jps.values() for p in PHASES] + sorted(custom)
    registrations = []
    for event, method in _event_methods(cb, target, where):
        phase, name = parse_event(event, where)
        attr = event.replace("-", "_")  # the method name, for the default event_methods
        if phase == CUSTOM:
            if name not in custom:
                raise _unknown(cb, attr, known, where)
            registrations.append(Registration(name, method, _options_of(cb, where, method, **options), (phase, name)))
        else:
            jp = jps.get(normalize(name))
            if jp is None:
                raise _unknown(cb, attr, known, where)
            registrations.append(Registration(f"{phase}-{jp.event}", method, _options_of(cb, where, method, **options),
                                              (phase, jp.event)))
    return registrations


def _event_methods(cb: Callback, target: Any, where: str) -> list[tuple[Any, Any]]:
    """``cb.event_methods(target)``, checked: a list of ``(event string, callable)``."""
    label = f"{where}: {type(cb).__qualname__}.event_methods"
    if not callable(getattr(cb, "event_methods", None)):
        raise HookError(f"{label} is not a method; define `def event_methods(self, target)` returning "
                        f"(event, callable) pairs, or leave the one hookwrap.Callback has.")
    pairs = cb.event_methods(target)
    try:
        pairs = list(pairs)
    except TypeError:
        raise HookError(f"{label}() returned {safe_repr(pairs)}; it must return a list of "
                        f"(event, callable) pairs.") from None
    if isinstance(cb, Defers):  # where what it holds back is settled (hookwrap.extend.Defers)
        pairs = cb.with_boundaries(target, pairs)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                and callable(pair[1])):
            raise HookError(f"{label}() returned {safe_repr(pair)} in its list; each item must be an "
                            f"(event, callable) pair like ('pre-step', self.pre_step).")
        made_for = getattr(pair[1], "__dict__", {}).get(READER_PHASE_ATTR)
        if made_for is not None and parse_event(pair[0], label)[0] != made_for:
            raise CallbackSignatureError(
                f"{label}() pairs event {pair[0]!r} with a reader made for {made_for}- events "
                f"({getattr(pair[1], '__qualname__', pair[1])}); make it for that event: "
                f"reader(handler, {pair[0]!r}, ...)."
            )
    return pairs


def _options_of(cb: Callback, where: str, method: Any, **options: Any) -> Options | None:
    """A registration's options for one of ``cb``'s methods (each its own filter state).
    A deferring callback's boundaries are not filtered by rank: they cost a gate on
    every call of their join points, and its ``settle`` knows its rank."""
    if cb.rank_zero_only and not (isinstance(cb, Defers) and is_boundary(method)):
        options["rank_zero_only"] = True
    return make_options(where, **options)


def _global_registration(event: Any, fn: Any, options: Options | None, where: str) -> Registration:
    return Registration(event, fn, options, parse_event(event, where))


def register_global_callback(cb: Any, **options: Any) -> Handle:
    """Register a ``Callback`` (each of its event methods) or an ``("event", fn)`` pair
    for every hookable object that has the event; returns a handle."""
    where = "register_global_callback"
    opts = make_options(where, **options)
    if isinstance(cb, Callback):
        registrations = []
        known_jps = {normalize(jp.event): jp for jp in all_join_points()}
        known = [f"{p}-{jp.event}" for jp in known_jps.values() for p in PHASES]
        for event, method in _event_methods(cb, None, where):
            registration = _global_registration(event, method, _options_of(cb, where, method, **options), where)
            if registration.phase != CUSTOM and registration.name not in known_jps:
                raise _unknown(cb, event.replace("-", "_"), known, f"{where}({type(cb).__qualname__})")
            registrations.append(registration)
        return settling(register_global(registrations, where), cb, None)
    if isinstance(cb, tuple) and len(cb) == 2:
        return register_global([_global_registration(cb[0], cb[1], opts, where)], where)
    raise NotACallbackError(
        f"{where}: expected a hookwrap.Callback instance or an ('event', fn) pair, got "
        f"{safe_repr(cb)} ({type(cb).__name__}) as the callback."
    )

