"""``Hookable`` (alias ``CallbackMixin``): the base class of hookable trainers."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Callable

from ._classes import ClassCallbacksAttribute, declared_callbacks, prepare_class
from ._policy import STATE_KEY
from ._registration import Handle, register
from ._instances import instance_state
from ._callback import Callback, add_callback
from ._emit import emit
from .errors import HookError
from ._events import CUSTOM
from ._hookable import hookable

__all__ = ["CallbackMixin", "Hookable"]


class DeclaredCallbacks(list):  # type: ignore[type-arg]
    """``SomeClass.callbacks``: the class's declared list, read-only after creation."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise HookError(
            "a class's declared `callbacks` list is fixed when the class is created. "
            "Register for all its instances with hookwrap.before(Cls, 'step', fn) (or after, "
            "around, on_error), on one object with obj.callbacks.append(...) or "
            "obj.before(...), or declare the entry in the class body."
        )

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse  # type: ignore[assignment]


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
