"""Chooses the per-call dispatch: compiled ``_fast`` or its pure twin ``_fast_py``;
and recognises a join point (``join_point_of``), the one place that does.

``HOOKWRAP_NO_EXTENSIONS=1`` (any value but empty, ``0``, ``false``, ``no``, ``off``)
forces the pure twin, as does
a Python other than CPython or a missing build. Every other module imports the
twins' names (``TWIN_NAMES``) from here, never from ``_fast``/``_fast_py`` directly,
and the policy they share from ``_policy``.
"""

from __future__ import annotations

import os
import sys
from types import FunctionType
from typing import TYPE_CHECKING, Any

# The twins' contract: what each of _fast and _fast_py defines alike. The policy
# they share (constants, emit plans, which filtered step runs) is _policy's.
TWIN_NAMES = ("ArgRef", "Chain", "EmitEvent", "HookState", "JoinPoint", "Step",
              "as_attribute", "call_around", "emitter", "show_python_twins")

__all__ = [*TWIN_NAMES, "NO_EXTENSIONS", "USING_EXTENSION", "join_point_of"]

NO_EXTENSIONS = os.environ.get("HOOKWRAP_NO_EXTENSIONS", "").strip().lower() not in ("", "0", "false", "no", "off") \
    or sys.implementation.name != "cpython"

if TYPE_CHECKING:
    # Type checkers read the typed pure twin; no stub file is needed.
    from . import _fast_py as impl
else:
    impl = None
    if not NO_EXTENSIONS:
        try:
            from . import _fast as impl
        except ImportError:  # no compiler when installed: run on the pure twin
            impl = None
    if impl is None:
        from . import _fast_py as impl

USING_EXTENSION: bool = impl.__name__.endswith("._fast")

ArgRef = impl.ArgRef
Chain = impl.Chain
EmitEvent = impl.EmitEvent
HookState = impl.HookState
JoinPoint = impl.JoinPoint
Step = impl.Step
as_attribute = impl.as_attribute
call_around = impl.call_around
emitter = impl.emitter
show_python_twins = impl.show_python_twins

from ._policy import JOIN_POINT_ATTR  # noqa: E402


def join_point_of(value: Any, through_wrappers: bool = False) -> Any:
    """The JoinPoint a stored attribute is, or carries; None for anything else.

    A join point is stored bare (compiled), as its dispatch function (pure twin),
    inside a classmethod/staticmethod, or inside a ``HookableWrapper``. The last
    two carry it as ``__hookwrap_join_point__``, read only from types that define
    it, so no arbitrary object's ``__getattr__`` runs. A function carries the mark
    only when it shares the join point's ``__dict__`` (its dispatch function does):
    ``functools.wraps`` copies the mark into a wrapper, which is not the join point.

    ``through_wrappers``: also a function wrapping one (``functools.wraps`` layers,
    followed by ``__wrapped__``). Libraries re-patch their own methods so
    (torch.optim's profile_hook_step on every optimizer class); a call of the
    wrapper reaches the join point, which fires once. Only the questions "does
    this attribute still reach that join point" ask this way.
    """
    for _ in range(_WRAPPER_DEPTH if through_wrappers else 1):
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        if type(value) is JoinPoint:
            return value
        if type(value) is not FunctionType:
            break
        found = value.__dict__.get(JOIN_POINT_ATTR)
        if found is not None and found.__dict__ is value.__dict__:
            return found
        value = value.__dict__.get("__wrapped__")
    else:
        return None
    if hasattr(type(value), JOIN_POINT_ATTR):
        return getattr(value, JOIN_POINT_ATTR)
    return None


_WRAPPER_DEPTH = 8  # functools.wraps layers followed to a join point
