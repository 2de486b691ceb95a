"""hookwrap: turn any method of existing training code into an interceptable join point."""

from __future__ import annotations

import sys as _sys

from ._dispatch import USING_EXTENSION
from ._registration import after
from ._registration import around
from ._registration import before
from ._registration import on
from ._registration import on_error
from ._callback import Callback
from ._callback import add_callback
from ._callback import register_global_callback
from ._describe import Description
from ._describe import describe
from ._chains import emit
from .errors import CallbackPicklingError
from .errors import CallbackReturnError
from .errors import CallbackSignatureError
from .errors import HookError
from .errors import HookwrapWarning
from .errors import StopTraining
from .errors import UnknownEventError
from ._hookable import HookableCallable
from ._hookable import HookableClassCallable
from ._hookable import hookable
from ._mixin import CallbackMixin
from ._mixin import Hookable
from ._registration import Handle
from ._lifecycle import CallbackState
from ._lifecycle import callback_state
from ._lifecycle import load_callback_state
from ._weave import WeaveHandle
from ._weave import weave

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
    "load_callback_state",
    "on",
    "on_error",
    "register_global_callback",
    "weave",
]

__version__ = "0.1.0"

# A hookable object's pickle names the hookwrap classes (and readers' functions) it
# holds by module path. The names they had before, in one place: where a module was
# merged into another, the old path is an alias of the new module (pickle imports
# it, and finds it here); a class renamed keeps its old name beside the new.
from . import _entries as _entries_module  # noqa: E402
from . import _joinpoints as _joinpoints_module  # noqa: E402
from . import _lifecycle as _lifecycle_module  # noqa: E402
from . import _tiers as _tiers_module  # noqa: E402

_MOVED = {"hookwrap._options": _entries_module, "hookwrap._state": _lifecycle_module,
          "hookwrap._instances": _tiers_module, "hookwrap._reader": _joinpoints_module,
          "hookwrap._signature": _joinpoints_module}
for _old, _module in _MOVED.items():
    _sys.modules.setdefault(_old, _module)
del _old, _module
_tiers_module.InstanceHooks = _tiers_module.InstanceRecord  # type: ignore[attr-defined]  # 0.1.0's name
