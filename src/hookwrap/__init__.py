"""hookwrap: turn any method of existing training code into an interceptable join point."""

from __future__ import annotations

from ._dispatch import USING_EXTENSION
from .api import after
from .api import around
from .api import before
from .api import on
from .api import on_error
from .callback import Callback
from .callback import add_callback
from .callback import register_global_callback
from .describe import Description
from .describe import describe
from .emit import emit
from .errors import CallbackPicklingError
from .errors import CallbackReturnError
from .errors import CallbackSignatureError
from .errors import HookError
from .errors import HookwrapWarning
from .errors import StopTraining
from .errors import UnknownEventError
from .hookable import HookableCallable
from .hookable import HookableClassCallable
from .hookable import hookable
from .mixin import CallbackMixin
from .mixin import Hookable
from ._registration import Handle
from .state import callback_state
from .state import load_callback_state
from .weave import WeaveHandle
from .weave import weave

__all__ = [
    "Callback",
    "CallbackMixin",
    "CallbackPicklingError",
    "CallbackReturnError",
    "CallbackSignatureError",
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
