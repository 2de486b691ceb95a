"""``Hookable`` (alias ``CallbackMixin``): the base class of hookable trainers; and
preparing each subclass when it is created: capture its ``callbacks`` list, keep
overrides of join points hookable, and check its class tier.
"""

from __future__ import annotations

import copy
import functools
from types import FunctionType
from typing import TYPE_CHECKING, Any, Callable

from ._callback import Callback, add_callback
from ._chains import emit
from ._entries import CUSTOM
from ._hookable import hookable, make_join_point
from ._joinpoints import check_pair, join_point_of, join_points, name_join_point
from ._owners import ClassCallbacksAttribute, callback_methods, class_record, lock
from ._registry import FixedList, Handle, check_class_tier, instance_state, register
from ._rules import STATE_KEY
from .errors import HookError

__all__ = ["CallbackMixin", "Hookable"]


# --- Preparing a Hookable subclass when it is created ----------------------------

_ABSENT = object()


def prepare_class(cls: type) -> None:
    """Run on every Hookable subclass at creation."""
    with lock:
        record = class_record(cls)
        assert record is not None
        if record.prepared:
            return
        record.prepared = True
        _prepare_subclasses_too(cls)
        declared = vars(cls).get("callbacks", _ABSENT)
        if declared is not _ABSENT and not isinstance(declared, ClassCallbacksAttribute):
            record.declared = _parse_declared(cls, declared)
            delattr(cls, "callbacks")  # the per-instance descriptor serves it now
        record.body = callback_methods(cls)
        _check_emits(cls)
        _keep_overrides_hookable(cls)
        # A class with join points of its own is checked now, so a typo fails at
        # its definition. A mixin (only the inherited `init`) may name events of
        # classes it will be mixed into: it is checked when first instantiated.
        if set(join_points(cls)) - {"init"}:
            check_class_tier(cls)
            record.checked = True


def _prepare_subclasses_too(cls: type) -> None:
    """A class defining ``__init_subclass__`` may forget ``super().__init_subclass__()``,
    and then Hookable never sees its subclasses: their class callbacks would never run
    and their typos go unnoticed. Its own runs first, then the subclass is prepared
    unless that call reached Hookable already."""
    own = vars(cls).get("__init_subclass__")
    if own is None or getattr(own, "__hookwrap_prepares__", False):
        return
    func = own.__func__ if isinstance(own, classmethod) else own

    @functools.wraps(func)
    def __init_subclass__(sub: type, **kwargs: Any) -> None:
        func(sub, **kwargs)
        prepare_class(sub)  # nothing more where Hookable's ran

    prepared: Any = classmethod(__init_subclass__)  # type: ignore[arg-type, unused-ignore]
    prepared.__hookwrap_prepares__ = True
    type.__setattr__(cls, "__init_subclass__", prepared)


def _check_emits(cls: type) -> None:
    """``emits`` names custom events: a list of identifiers, none a join point's event."""
    emits = vars(cls).get("emits")
    if emits is None:
        return
    where = f"{cls.__qualname__}.emits"
    if isinstance(emits, str) or not isinstance(emits, (list, tuple, set, frozenset)):
        raise HookError(f"{where} must be a list of custom event names, like ({emits!r},), "
                        f"not a {type(emits).__name__}.")
    for name in emits:
        if not isinstance(name, str) or not name.isidentifier():
            raise HookError(
                f"{where}: {name!r} is not a custom event name; name one like 'on_train_batch_end' "
                f"(join point events such as 'pre-step' exist already and are not declared)."
            )


def _parse_declared(cls: type, declared: Any) -> tuple[Any, ...] | None:
    if declared is None:
        return None
    where = f"{cls.__qualname__}.callbacks"
    if not isinstance(declared, (list, tuple)):
        raise HookError(f"{where} must be a list of (event, callback) pairs, got {declared!r}.")
    return tuple(check_pair(item, where) for item in declared)


def declared_callbacks(cls: Any) -> list[tuple[str, Any]]:
    """The entries ``cls`` itself declared in its ``callbacks`` list."""
    record = class_record(cls, create=False)
    return list((record.declared or ()) if record is not None else ())


def _keep_overrides_hookable(cls: type) -> None:
    for name, value in list(vars(cls).items()):  # name first: __set_name__ may not have
        jp = join_point_of(value)
        if jp is not None and jp.owner is None:
            name_join_point(value, cls, name)
    for name, value in list(vars(cls).items()):
        inherited = None
        for base in cls.__mro__[1:]:
            if name in vars(base):
                inherited = join_point_of(vars(base)[name])
                break
        if inherited is None:
            continue
        own = join_point_of(value)
        if own is not None:
            if not own.explicit_event:  # an override keeps the event name it overrides
                own.event = inherited.event
        elif isinstance(value, FunctionType):
            attribute = make_join_point(value, inherited.event)
            jp = join_point_of(attribute)
            jp.explicit_event = inherited.explicit_event
            setattr(cls, name, attribute)
            name_join_point(attribute, cls, name)


# --- Hookable --------------------------------------------------------------------

class DeclaredCallbacks(FixedList):
    """``SomeClass.callbacks``: the class's declared list, read-only after creation."""

    refusal = ("a class's declared `callbacks` list is fixed when the class is created. "
               "Register for all its instances with hookwrap.before(Cls, 'step', fn) (or after, "
               "around, on_error), on one object with obj.callbacks.append(...) or "
               "obj.before(...), or declare the entry in the class body.")


class _Callbacks(ClassCallbacksAttribute):
    """``obj.callbacks`` is the object's own list; ``Cls.callbacks`` the declared one."""

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        if obj is None:
            return DeclaredCallbacks(declared_callbacks(cls))
        return instance_state(obj).callbacks  # type: ignore[union-attr]

    def __set__(self, obj: Any, value: Any) -> None:
        instance_state(obj).callbacks[:] = list(value)  # type: ignore[union-attr]


class Hookable:
    """Base class whose hookable methods are join points; ``__init__`` is ``init``.

    Callbacks come from each class's ``callbacks = [("pre-step", fn)]`` list and its
    ``pre_step_callback``-style methods (base class first), then from the instance:
    ``obj.callbacks.append(...)``, ``obj.before("step", fn)``, ``obj.after(...)``.
    """

    callbacks = _Callbacks()
    # What a preset declares on a framework's class (hookwrap.integrations._weaving:
    # holds_gradients, scales_loss), read by GradNorm and GradClip at every call: a loop
    # of your own declares nothing, found here rather than by a missed lookup each step.
    __hookwrap_grad_norm__ = None
    __hookwrap_grad_scaler__ = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        prepare_class(cls)

    if TYPE_CHECKING:  # checkers see a plain constructor
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    else:
        @hookable("init")
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)

    def before(self, event: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
        """Run ``fn`` before join point ``event`` (``pre-<event>``) on this object only."""
        return register(self, "pre", event, fn, options)

    def after(self, event: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
        """Run ``fn`` after join point ``event`` (``post-<event>``) on this object only."""
        return register(self, "post", event, fn, options)

    def around(self, event: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
        """Wrap join point ``event``: ``fn(self, proceed, *args, **kwargs)`` calls
        ``proceed(*args, **kwargs)`` at most once and returns the result."""
        return register(self, "around", event, fn, options)

    def on_error(self, event: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
        """Observe an exception raised by join point ``event`` (``error-<event>``)."""
        return register(self, "error", event, fn, options)

    def on(self, name: str, fn: Callable[..., Any] | None = None, /, **options: Any) -> Handle:
        """Run ``fn`` when this object emits custom event ``name``."""
        return register(self, CUSTOM, name, fn, options)

    if TYPE_CHECKING:
        def emit(self, name: str, /, **kwargs: Any) -> None:
            """Fire custom event ``name`` (declared in ``emits``) with keyword arguments."""
    else:
        emit = emit  # hookwrap.emit itself: it binds like a method (see _dispatch.emitter)

    def add_callback(self, callback: Callback, /, **options: Any) -> Handle:
        """Register each event method of a ``hookwrap.Callback`` on this object, each
        with the registration ``options`` (``every=10``, ``rank_zero_only=True``, ...)."""
        return add_callback(self, callback, **options)

    def __copy__(self) -> Any:
        # A shallow copy gets its own instance callbacks list (same callbacks, each
        # with filter counters of its own), so registering on the copy, or calling
        # it, does not change the original.
        cls = type(self)
        clone = cls.__new__(cls)
        clone.__dict__.update(self.__dict__)
        state = self.__dict__.get(STATE_KEY)
        if state is not None:
            clone.__dict__[STATE_KEY] = copy.copy(state)
        return clone


CallbackMixin = Hookable
