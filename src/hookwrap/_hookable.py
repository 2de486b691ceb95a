"""Making join points: ``@hookable`` on code you write, ``weave()`` on code you don't.

``@hookable``: plain functions (``def``/``async def``, in a class body or not)
become a compiled ``JoinPoint``: a descriptor that binds like a function
(vectorcall, no bound object built per attribute lookup) and dispatches the
callbacks of its event. A classmethod or staticmethod of a plain function stays
one, around such a join point (their own ``__get__`` binds at C speed; wrapt's
classmethod binding costs about a microsecond a call). Every other kind of
callable -- a callable object, a builtin, a partial -- is wrapped in a
``wrapt.FunctionWrapper``, which gets binding right for each of them, around the
same ``JoinPoint``.

``hw.weave(target, *names, **events)``: make methods of existing classes, or
functions of existing modules, hookable without editing them (a third-party
trainer). ``target`` is a class, a module, or a dotted string
``"package.module:Class"`` (``"package.module"`` for its functions): weaving is
then applied when that module is imported, or at once if it already is, without
importing it (wrapt's post-import hooks). The attribute is resolved on the module
as ``sys.modules`` holds it once imported, so a package that replaces itself with
a lazy module (transformers) resolves ``"transformers:Trainer"`` as ``from
transformers import Trainer`` does. ``events`` name the join points
(``step="training_step"``), so callbacks written for one loop's event names work
on another's. The handle's ``remove()`` restores the originals exactly.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import re
import sys
import threading
import warnings
from types import FunctionType, ModuleType
from typing import (
    Any,
    Callable,
    Concatenate,
    ParamSpec,
    Protocol,
    Self,
    SupportsIndex,
    TypeVar,
    overload,
)

import wrapt

from ._chains import PLANNER
from ._dispatch import JoinPoint, as_attribute
from ._entries import PHASES, normalize
from ._joinpoints import join_point_of, join_points, name_join_point, spec_of, track_join_point, untrack_join_point
from ._owners import changed_class, discard_class_record, is_builtin_type, with_subclasses
from ._registry import Handle, Removable, register
from ._rules import CLASSMETHOD, FUNCTION, JOIN_POINT_ATTR
from ._traced import drop_compiled_code, install
from .errors import HookError, HookwrapWarning, closest, safe_repr

__all__ = [
    "HookableCallable",
    "HookableClassCallable",
    "HookableWrapper",
    "WeaveHandle",
    "hookable",
    "make_join_point",
    "weave",
    "weave_only",
]


# --- @hookable -------------------------------------------------------------------

P = ParamSpec("P")
Q = ParamSpec("Q")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
T_co = TypeVar("T_co", covariant=True)
S = TypeVar("S")
T = TypeVar("T")


class HookableCallable(Protocol[P, R_co]):
    """What ``@hookable`` returns, as type checkers see it: the function's own
    signature (``P``, ``R_co``), bound like a method when it is one, with the
    registration verbs and ``__wrapped__``."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    @property
    def __wrapped__(self) -> Callable[P, R_co]: ...

    def before(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle: ...

    def after(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle: ...

    def around(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle: ...

    def on_error(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle: ...

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None, /) -> Self: ...
    @overload
    def __get__(self: HookableCallable[Concatenate[S, Q], R], obj: S,
                owner: type[Any] | None = None, /) -> Callable[Q, R]: ...


class HookableClassCallable(HookableCallable[Concatenate[type[T_co], P], R_co], Protocol[T_co, P, R_co]):
    """``@hookable`` over ``@classmethod`` (mypy hands the decorator the function,
    whose first parameter is the class): bound to the class however it is reached."""

    def __get__(self, obj: Any, owner: type[Any] | None = None, /) -> Callable[P, R_co]: ...  # type: ignore[override]


class _HookableDecorator(Protocol):
    """``@hookable("loss")``: the decorator it returns."""

    @overload
    def __call__(self, fn: classmethod[T, P, R], /) -> classmethod[T, P, R]: ...
    @overload
    def __call__(self, fn: staticmethod[P, R], /) -> staticmethod[P, R]: ...  # type: ignore[overload-overlap]
    @overload
    def __call__(self, fn: Callable[Concatenate[type[T], P], R], /) -> HookableClassCallable[T, P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> HookableCallable[P, R]: ...


def _registration_verbs(jp: Any) -> dict[str, Callable[..., Handle]]:
    """``fn.before(cb)`` and friends, for a join point used as a function.

    On a plain function they register on that function; on a method they register
    on its class (all instances and subclasses)."""

    def target() -> Any:
        return jp.owner if jp.owner is not None else jp

    def verb(phase: str, doc: str) -> Callable[..., Handle]:
        def register_callback(fn: Any = None, /, **options: Any) -> Handle:
            return register(target(), phase, jp.event, fn, options)

        register_callback.__doc__ = doc
        return register_callback

    return {
        "before": verb("pre", "Run a callback before this join point (pre-<event>)."),
        "after": verb("post", "Run a callback after this join point (post-<event>)."),
        "around": verb("around", "Wrap this join point: fn(self, proceed, *args, **kwargs)."),
        "on_error": verb("error", "Observe an exception raised by this join point."),
    }


class HookableWrapper(wrapt.FunctionWrapper[..., Any]):
    """A join point around a callable that is not a plain function."""

    def __init__(self, wrapped: Any, join_point: Any) -> None:
        if join_point.binding == CLASSMETHOD:
            def dispatch(_wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                return join_point(instance, *args, **kwargs)
        else:
            def dispatch(_wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                return join_point(*args, **kwargs)
        super().__init__(wrapped, dispatch)
        self._self_join_point = track_join_point(join_point)
        self._self_verbs = _registration_verbs(join_point)

    @property
    def __hookwrap_join_point__(self) -> Any:  # how _joinpoints.join_point_of finds it
        return self._self_join_point

    def __set_name__(self, owner: type, name: str) -> None:
        name_join_point(self, owner, name)

    def before(self, fn: Any = None, /, **options: Any) -> Handle:
        """Run a callback before this join point (pre-<event>)."""
        return self._self_verbs["before"](fn, **options)

    def after(self, fn: Any = None, /, **options: Any) -> Handle:
        """Run a callback after this join point (post-<event>)."""
        return self._self_verbs["after"](fn, **options)

    def around(self, fn: Any = None, /, **options: Any) -> Handle:
        """Wrap this join point: fn(self, proceed, *args, **kwargs)."""
        return self._self_verbs["around"](fn, **options)

    def on_error(self, fn: Any = None, /, **options: Any) -> Handle:
        """Observe an exception raised by this join point."""
        return self._self_verbs["on_error"](fn, **options)

    def __reduce_ex__(self, protocol: SupportsIndex) -> str:
        # wrapt refuses to pickle proxies; a module-level join point pickles by name.
        return str(self.__qualname__)


@overload
def hookable(fn: classmethod[T, P, R], /) -> classmethod[T, P, R]: ...
@overload
def hookable(fn: staticmethod[P, R], /) -> staticmethod[P, R]: ...  # type: ignore[overload-overlap]
@overload
def hookable(fn: Callable[Concatenate[type[T], P], R], /) -> HookableClassCallable[T, P, R]: ...
@overload
def hookable(fn: Callable[P, R], /) -> HookableCallable[P, R]: ...
@overload
def hookable(event: str | None = None, /) -> _HookableDecorator: ...


def hookable(fn: Any = None, /) -> Any:
    """Make ``fn`` a join point ``X`` with events ``pre-X``, ``post-X``, ``around-X``
    and ``error-X``.

    ``@hookable`` names the event after the attribute the function is bound to in
    its class (else its ``__name__``); ``@hookable("loss")`` names it explicitly.
    The decorated callable keeps its name, docstring, signature and ``__wrapped__``.
    """
    if fn is None or isinstance(fn, str):
        event = fn
        return lambda f: make_join_point(f, event)
    return make_join_point(fn, None)


def _function_join_point(fn: FunctionType, event: str | None, binding: int) -> Any:
    """A join point for a plain function, as the object to store (see as_attribute)."""
    jp = track_join_point(JoinPoint(fn, event, binding, PLANNER))
    mark = vars(jp).get(JOIN_POINT_ATTR)  # the pure twin's own; not one fn's __dict__ carries
    functools.update_wrapper(jp, fn)
    if mark is not None:
        vars(jp)[JOIN_POINT_ATTR] = mark
    else:
        vars(jp).pop(JOIN_POINT_ATTR, None)  # copied from a wrapper of another join point
    vars(jp).update(_registration_verbs(jp))
    stored = as_attribute(jp)
    if jp.is_async:
        _mark_coroutine_function(jp, stored, fn)
    return stored


def _mark_coroutine_function(jp: Any, stored: Any, fn: FunctionType) -> None:
    """Make ``inspect.iscoroutinefunction`` (and asyncio's) True for the join point
    of ``async def fn``, as for ``fn``, in both twins and bound to an instance."""
    mark = getattr(inspect, "markcoroutinefunction", None)
    if mark is not None:  # 3.12+: a mark in its __dict__ (the pure twin's shares it)
        mark(jp)
    else:
        # 3.11 reads the code flags of a function or of a function-like object,
        # which the join point becomes with these (stored as itself in both twins:
        # _fast_py._ASYNC_STORED_AS_ITSELF).
        vars(jp).update(__code__=fn.__code__, __defaults__=fn.__defaults__,
                        __kwdefaults__=fn.__kwdefaults__)


def make_join_point(fn: Any, event: str | None) -> Any:
    """The join point for ``fn``: a JoinPoint for functions, a wrapt wrapper otherwise."""
    phase, dash, _ = (event or "").partition("-")
    if event is not None and (not event or event.startswith("-") or (dash and phase in PHASES)):
        raise HookError(
            f"@hookable({safe_repr(event)}): give the join point name, like 'loss'; its events "
            f"(pre-loss, post-loss, ...) are named after it."
        )
    existing = join_point_of(fn)
    if existing is not None:
        if event is not None and event != existing.event:
            raise HookError(
                f"{existing.event!r} is already a join point; it cannot also be {event!r}. "
                f"Apply @hookable once."
            )
        return fn
    if isinstance(fn, FunctionType):
        return _function_join_point(fn, event, FUNCTION)
    # A classmethod/staticmethod stays one, around a compiled join point: their own
    # __get__ binds cheaply (wrapt's binding of a classmethod costs ~1 us a call).
    if isinstance(fn, classmethod) and isinstance(fn.__func__, FunctionType):
        return classmethod(_function_join_point(fn.__func__, event, CLASSMETHOD))
    if isinstance(fn, staticmethod) and isinstance(fn.__func__, FunctionType):
        return staticmethod(_function_join_point(fn.__func__, event, FUNCTION))
    if isinstance(fn, (classmethod, staticmethod)):
        binding = CLASSMETHOD if isinstance(fn, classmethod) else FUNCTION
        return HookableWrapper(fn, JoinPoint(fn.__func__, event, binding, PLANNER))
    if callable(fn):
        return HookableWrapper(fn, JoinPoint(fn, event, FUNCTION, PLANNER))
    raise HookError(
        f"@hookable needs a function or method, got {safe_repr(fn)} ({type(fn).__name__}). "
        f"Put @hookable directly above a `def`."
    )


# --- weave() ---------------------------------------------------------------------

_lock = threading.Lock()
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class WeaveHandle(Removable):
    """Undoes a weave: ``remove()`` puts every original back (idempotent)."""

    def __init__(self, description: str, overrides: bool = True) -> None:
        self.description = description
        self.overrides = overrides  # also weave the overrides of the class's subclasses
        self.target: Any = None
        self._saved: list[tuple[Any, str, bool, Any]] = []  # (owner, name, was_own, original)
        self._removed = False
        self.error: str | None = None  # why a dotted target could not be woven on import

    @property
    def applied(self) -> bool:
        return bool(self._saved)

    def _apply(self, target: Any, names: dict[str, str | None]) -> None:
        """Weave each attribute of ``names`` (attribute -> event name, or None for
        the attribute's own name). Checked whole before anything is changed."""
        with _lock:
            if self._removed:
                return
            _check_target(target, names, self.description)
            is_class = isinstance(target, type)
            overrides = _overrides(target, names) if is_class and self.overrides else []
            for klass, name, event in overrides:
                _check_target(klass, {name: event}, f"{self.description}: subclass {klass.__qualname__}")
            self.target = target
            made = []
            for owner, name, event in [(target, name, event) for name, event in names.items()] + overrides:
                original = _raw_attribute(owner, name) if is_class else getattr(owner, name)
                woven = make_join_point(original, event)
                if is_class:  # named before it is stored: a call from another thread finds it whole
                    name_join_point(woven, owner, name)
                # Its parameters read now: a signature no call could bind is refused here,
                # before anything is woven, not at every call of the code woven.
                spec_of(join_point_of(woven))
                made.append((owner, name, original, woven))
            for owner, name, original, woven in made:
                own = name in vars(owner)
                setattr(owner, name, woven)
                if is_class:  # named before it was stored, where install() found nothing to replace
                    install(join_point_of(woven), owner, name)
                self._saved.append((owner, name, own, original))
            if is_class:
                for owner in dict.fromkeys([target] + [klass for klass, _, _ in overrides]):
                    changed_class(owner, None, structure=True)
            drop_compiled_code()

    def remove(self) -> None:
        self._remove(restore=True)

    def _remove(self, restore: bool) -> None:
        """``restore=False``: forget the weave but leave the attributes as they are now
        (a preset whose wrapper another preset's wrapper now calls: see
        integrations._weaving)."""
        with _lock:
            self._removed = True
            for owner, name, own, original in reversed(self._saved):
                stored = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
                woven = join_point_of(stored)
                if woven is not None and woven.record is not None:  # a function's registrations
                    woven.record.forget_order()
                    woven.record.registrations.clear()  # go with it, and its handles say so
                    woven.record.changed(None)
                if not restore:
                    pass
                else:
                    if woven is not None:
                        untrack_join_point(woven)
                    if own:
                        setattr(owner, name, original)
                    else:
                        delattr(owner, name)
                if isinstance(owner, type):
                    _restore_class(owner)
            if self._saved:
                drop_compiled_code()
            self._saved.clear()

    def __repr__(self) -> str:
        if self.applied:
            state = "applied"
        elif self._removed:
            state = "removed"
        elif self.error is not None:
            state = f"failed: {self.error}"
        else:
            state = "pending import"
        return f"<hookwrap.WeaveHandle {self.description} {state}>"


def _check_target(target: Any, names: dict[str, str | None], description: str) -> None:
    """Refuse what cannot be woven, naming it and the fix, before changing anything."""
    where = f"weave({description})"
    if isinstance(target, type) and is_builtin_type(target):
        raise HookError(
            f"{where}: {target.__qualname__} is a built-in or extension type, whose methods "
            f"cannot be replaced. Weave the Python class or function that calls it instead."
        )
    events: dict[str, str] = {}
    for name, event in names.items():
        if not hasattr(target, name):
            public = [n for n in dir(target) if not n.startswith("__")]
            raise HookError(f"{where}: it has no attribute {name!r} to weave." + closest(name, public))
        original = _raw_attribute(target, name) if isinstance(target, type) else getattr(target, name)
        if join_point_of(original) is not None:
            raise HookError(f"{where}: {name!r} is already a join point.")
        if not callable(original) and not isinstance(original, (classmethod, staticmethod)):
            raise HookError(f"{where}: {name!r} is a {type(original).__name__}, not a method or function.")
        key = normalize(event or name)
        if key in events:
            raise HookError(
                f"{where}: {events[key]!r} and {name!r} would both be join point {event or name!r}; "
                f"give each its own event name."
            )
        events[key] = name
    if isinstance(target, type):
        for key, name in events.items():
            existing = join_points(target).get(key)
            if existing is not None and existing.attr_name not in names:
                raise HookError(
                    f"{where}: {target.__qualname__} already has a join point {existing.event!r} "
                    f"({existing.attr_name}); weave {name!r} under another event name."
                )


def _overrides(cls: type, names: dict[str, str | None]) -> list[tuple[type, str, str | None]]:
    """``(subclass, name, event)`` for each method of ``names`` that a subclass of ``cls``
    existing now defines in its own body and that is no join point yet: woven with
    ``cls``, under the same event, as an override of a ``@hookable`` method stays one
    (a weave of the base alone would never fire for them: ``fires``)."""
    found = []
    for klass in with_subclasses(cls):
        if klass is cls or is_builtin_type(klass):
            continue
        for name, event in names.items():
            value = vars(klass).get(name)
            if value is None or join_point_of(value, through_wrappers=True) is not None:
                continue  # inherited, set to None to drop it, or hookable already
            if callable(value) or isinstance(value, (classmethod, staticmethod)):
                found.append((klass, name, event))
    return found


def _restore_class(cls: type) -> None:
    """After un-weaving: drop what was built from the woven methods, and leave no
    trace in a class (or subclass) that has no join point left."""
    changed_class(cls, None, structure=True)
    for klass in list(with_subclasses(cls)):
        if not join_points(klass):
            discard_class_record(klass)


def _raw_attribute(cls: type, name: str) -> Any:
    """The attribute as stored in the class (a classmethod stays a classmethod)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return getattr(cls, name)


def _name_of(target: Any) -> str | None:
    """A class's or module's name, where it has a plain string one."""
    for attr in ("__qualname__", "__name__"):
        try:
            name = getattr(target, attr, None)
        except Exception:  # noqa: BLE001 - a user's __getattr__: the repr will do
            return None
        if isinstance(name, str) and name:
            return name
    return None


def weave(target: Any, /, *names: str, **events: str) -> WeaveHandle:
    """Make ``names`` of ``target`` hookable, each a join point of its own name, and
    each ``event=attribute`` of ``events`` a join point named ``event``
    (``weave(Trainer, step="training_step")``); returns a handle that restores them.
    A class's subclasses that override one of them (now) are woven with it."""
    return _weave(target, names, events, overrides=True)


def weave_only(target: Any, /, *names: str, **events: str) -> WeaveHandle:
    """``weave``, leaving the overrides in ``target``'s subclasses as they are: for
    callers that weave those their own way (the presets, ``torch_optim``)."""
    return _weave(target, names, events, overrides=False)


def _weave(target: Any, names: tuple[str, ...], events: dict[str, str], overrides: bool) -> WeaveHandle:
    label: str = target if isinstance(target, str) else (
        _name_of(target) or safe_repr(target))
    wanted = _wanted(label, names, events)
    if isinstance(target, str):
        return _weave_on_import(target, wanted, overrides)
    if not isinstance(target, (type, ModuleType)):
        raise HookError(
            f"weave({safe_repr(target)}): the target must be a class, a module, or a dotted "
            f"'package.module:Class' string."
        )
    handle = WeaveHandle(label, overrides)
    handle._apply(target, wanted)
    return handle


def _wanted(label: str, names: tuple[str, ...], events: dict[str, str]) -> dict[str, str | None]:
    """attribute -> explicit event name (None: the attribute's own), checked."""
    where = f"weave({label})"
    if not names and not events:
        raise HookError(
            f"{where}: name the methods or functions to make hookable: weave(target, 'train'), "
            f"or with event names, weave(target, step='training_step')."
        )
    wanted: dict[str, str | None] = {}
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise HookError(f"{where}: {safe_repr(name)} is not an attribute name.")
        wanted[name] = None
    for event, name in events.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise HookError(f"{where}: {event}={safe_repr(name)}: give the attribute to weave as a name.")
        phase, _, rest = event.partition("_")
        if phase in PHASES:  # 'pre_step' reads as the event pre-step of join point step
            raise HookError(
                f"{where}: {event}={name!r}: a join point's name cannot start with {phase!r}, "
                f"which names its events ({phase}-{rest or 'step'}); name it like step='training_step'."
            )
        if name in wanted:
            raise HookError(f"{where}: {name!r} is named twice; weave each attribute once.")
        wanted[name] = event
    return wanted


def _weave_on_import(target: str, wanted: dict[str, str | None], overrides: bool) -> WeaveHandle:
    """A dotted target: woven when its module is imported (now, if it already is)."""
    module_name, colon, attr_path = target.partition(":")
    if not _DOTTED.fullmatch(module_name) or (colon and not _DOTTED.fullmatch(attr_path)) \
            or attr_path.count(":"):
        raise HookError(
            f"weave({target!r}): a dotted target is 'package.module:Class' (a class), "
            f"'package.module:Class.Inner', or 'package.module' (its functions)."
        )
    handle = WeaveHandle(target, overrides)

    def apply(module: ModuleType, on_import: bool = True) -> None:
        # The module as sys.modules holds it: a package may have replaced itself with
        # a lazy module (transformers' _LazyModule) whose __getattr__ imports the class.
        obj: Any = sys.modules.get(module_name, module)
        try:
            path = module_name
            for part in filter(None, attr_path.split(".")):
                try:
                    obj = getattr(obj, part)
                except AttributeError:
                    names = [n for n in dir(obj) if not n.startswith("_")]
                    raise HookError(f"{path} has no attribute {part!r}." + closest(part, names)) from None
                path = f"{path}.{part}"
            handle._apply(obj, wanted)
        except Exception as exc:  # a lazy module's __getattr__ may raise anything
            why = str(exc) if isinstance(exc, HookError) else f"{type(exc).__name__}: {exc}"
            if not on_import:
                if isinstance(exc, HookError):
                    raise
                raise HookError(f"weave({target!r}): {why}") from exc
            # Raising here would fail the user's import; say it instead.
            handle.error = why.rstrip(".")
            warnings.warn(
                f"hookwrap.weave({target!r}): {module_name} was imported, but the target could not "
                f"be woven ({handle.error}). Check the spelling, or weave the class itself: "
                f"hookwrap.weave(cls, ...).",
                HookwrapWarning, stacklevel=2,
            )

    if module_name in sys.modules:
        apply(sys.modules[module_name], on_import=False)
    else:
        why = _never_imported(module_name)
        if why is not None:
            raise HookError(f"weave({target!r}): {why}")
        wrapt.register_post_import_hook(apply, module_name)
    return handle


def _never_imported(module_name: str) -> str | None:
    """Why ``module_name`` can never be imported, as its nearest imported parent shows
    (``json`` is imported and has no submodule ``dumps``), with the fix; None when it
    may be. Imports nothing: only an imported package's own folder is looked in."""
    parts = module_name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:i])
        if parent in sys.modules:
            break
    else:
        return None  # nothing of it imported yet: it is waited for
    module, child = sys.modules[parent], parts[i]
    if getattr(module, "__path__", None) is None:
        why = f"{parent} is imported and is a module, not a package: it has no submodule {child!r}."
    else:
        try:
            if importlib.util.find_spec(f"{parent}.{child}") is not None:
                return None
        except (ImportError, ValueError):  # a package whose finder cannot tell: wait for it
            return None
        why = f"{parent} is imported and has no submodule {child!r}."
    # Read without its __getattr__ (a lazy module's imports).
    value = getattr(module, "__dict__", {}).get(child)
    if isinstance(value, type):
        return f"{why} {parent}.{child} is a class: weave its methods with 'package.module:Class', " \
               f"hookwrap.weave('{parent}:{child}', ...)."
    if callable(value):
        return f"{why} {child} is a function of {parent}: weave it with hookwrap.weave('{parent}', '{child}')."
    return f"{why} Check the spelling; a class is named 'package.module:Class'."
