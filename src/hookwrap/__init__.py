"""hookwrap: turn any method of existing training code into an interceptable join point."""

from __future__ import annotations

from ._dispatch import USING_EXTENSION
from ._api import after
from ._api import around
from ._api import before
from ._api import on
from ._api import on_error
from ._callback import Callback
from ._callback import add_callback
from ._callback import register_global_callback
from ._describe import Description
from ._describe import describe
from ._emit import emit
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
from ._state import CallbackState
from ._state import callback_state
from ._state import load_callback_state
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
