"""hookwrap: turn any method of existing training code into an interceptable join point."""

from __future__ import annotations

import sys as _sys

from ._callback import (
    Callback,
    CallbackState,
    add_callback,
    callback_state,
    load_callback_state,
    register_global_callback,
    settle_on_signals,
)
from ._chains import emit, hooks_off
from ._describe import Description, describe
from ._dispatch import USING_EXTENSION
from ._hookable import HookableCallable, HookableClassCallable, WeaveHandle, hookable, weave
from ._mixin import CallbackMixin, Hookable
from ._registry import Handle, after, around, before, on, on_error
from .errors import (
    CallbackPicklingError,
    CallbackReturnError,
    CallbackSignatureError,
    HookError,
    HookwrapWarning,
    SettingError,
    StopTraining,
    UnknownEventError,
)

__all__ = [
    "Callback",
    "CallbackMixin",
    "CallbackPicklingError",
    "CallbackReturnError",
    "CallbackSignatureError",
    "CallbackState",
    "Description",
    "Handle",
    "HookError",
    "Hookable",
    "HookableCallable",
    "HookableClassCallable",
    "HookwrapWarning",
    "SettingError",
    "StopTraining",
    "USING_EXTENSION",
    "UnknownEventError",
    "WeaveHandle",
    "add_callback",
    "after",
    "around",
    "before",
    "callback_state",
    "describe",
    "emit",
    "hookable",
    "hooks_off",
    "load_callback_state",
    "on",
    "on_error",
    "register_global_callback",
    "settle_on_signals",
    "weave",
]

__version__ = "0.1.0"

# A hookable object's pickle names the hookwrap classes (and readers' functions) it
# holds by module path. The names they had before, in one place: where a module was
# merged into another, the old path is an alias of the new module (pickle imports
# it, and finds it here); a class renamed keeps its old name beside the new.
from . import _callback as _callback_module  # noqa: E402
from . import _entries as _entries_module  # noqa: E402
from . import _joinpoints as _joinpoints_module  # noqa: E402
from . import _registry as _registry_module  # noqa: E402

_MOVED = {"hookwrap._options": _entries_module, "hookwrap._state": _callback_module,
          "hookwrap._lifecycle": _callback_module,
          "hookwrap._instances": _registry_module, "hookwrap._tiers": _registry_module,
          "hookwrap._registration": _registry_module, "hookwrap._reader": _joinpoints_module,
          "hookwrap._signature": _joinpoints_module}
for _old, _module in _MOVED.items():
    _sys.modules.setdefault(_old, _module)
del _old, _module
_registry_module.InstanceHooks = _registry_module.InstanceRecord  # type: ignore[attr-defined]  # 0.1.0's name
