"""Chooses the per-call dispatch: compiled ``_fast`` or its pure twin ``_fast_py``.

``HOOKWRAP_NO_EXTENSIONS=1`` (any value but empty, ``0``, ``false``, ``no``, ``off``)
forces the pure twin, as does
a Python other than CPython or a missing build. Every other module imports the
twins' names (``TWIN_NAMES``) from here, never from ``_fast``/``_fast_py`` directly,
and the plan and rules they share from ``_rules``.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

# The twins' contract: what each of _fast and _fast_py defines alike. The plan
# they share (constants, emit plans, which filtered step runs) is _rules'.
TWIN_NAMES = ("ArgRef", "Chain", "EmitEvent", "HookState", "JoinPoint", "Step",
              "as_attribute", "call_around", "emitter", "show_python_twins")

__all__ = [*TWIN_NAMES, "NO_EXTENSIONS", "USING_EXTENSION"]

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
