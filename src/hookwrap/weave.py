"""``hw.weave(target, *names)``: make methods of existing classes, or functions of
existing modules, hookable without editing them (a third-party trainer).

``target`` is a class, a module, or a dotted string ``"package.module:Class"``
(``"package.module"`` for its functions): weaving is then applied when that
module is imported, or at once if it already is, without importing it (wrapt's
post-import hooks). The handle's ``remove()`` restores the originals exactly.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import Any

import wrapt

from ._dispatch import join_point_of
from ._joinpoints import join_points, name_join_point
from ._owners import changed_class, discard_class_record, with_subclasses
from ._registration import Removable
from .errors import HookError
from ._traced import drop_compiled_code
from .hookable import make_join_point

__all__ = ["WeaveHandle", "weave"]

_lock = threading.Lock()


class WeaveHandle(Removable):
    """Undoes a weave: ``remove()`` puts every original back (idempotent)."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.target: Any = None
        self._saved: list[tuple[Any, str, bool, Any]] = []  # (owner, name, was_own, original)
        self._removed = False

    @property
    def applied(self) -> bool:
        return bool(self._saved)

    def _apply(self, target: Any, names: tuple[str, ...]) -> None:
        with _lock:
            if self._removed:
                return
            self.target = target
            is_class = isinstance(target, type)
            for name in names:
                if not hasattr(target, name):
                    raise HookError(f"weave({self.description}): it has no attribute {name!r} to weave.")
                own = name in vars(target)
                original = _raw_attribute(target, name) if is_class else getattr(target, name)
                if join_point_of(original) is not None:
                    raise HookError(f"weave({self.description}): {name!r} is already a join point.")
                woven = make_join_point(original, None)
                setattr(target, name, woven)
                if is_class:
                    name_join_point(woven, target, name)
                self._saved.append((target, name, own, original))
            if is_class:
                changed_class(target, None, structure=True)
            drop_compiled_code()

    def remove(self) -> None:
        with _lock:
            self._removed = True
            for owner, name, own, original in reversed(self._saved):
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
        state = "applied" if self.applied else ("removed" if self._removed else "pending import")
        return f"<hookwrap.WeaveHandle {self.description} {state}>"


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


def weave(target: Any, *names: str) -> WeaveHandle:
    """Make ``names`` of ``target`` hookable; returns a handle that restores them."""
    if not names:
        raise HookError(f"weave({target!r}): name the methods or functions to make hookable.")
    if isinstance(target, str):
        module_name, _, attr_path = target.partition(":")
        handle = WeaveHandle(target)

        def apply(module: ModuleType) -> None:
            obj: Any = module
            for part in filter(None, attr_path.split(".")):
                obj = getattr(obj, part)
            handle._apply(obj, names)

        if module_name in sys.modules:
            apply(sys.modules[module_name])
        else:
            wrapt.register_post_import_hook(apply, module_name)
        return handle
    if not isinstance(target, (type, ModuleType)):
        raise HookError(
            f"weave({target!r}): the target must be a class, a module, or a dotted "
            f"'package.module:Class' string."
        )
    handle = WeaveHandle(getattr(target, "__qualname__", None) or target.__name__)
    handle._apply(target, names)
    return handle
