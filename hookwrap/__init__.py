"""hookwrap: turn any method of existing training code into an interceptable join point."""

from __future__ import annotations

from ._dispatch import USING_EXTENSION
from .errors import CallbackReturnError
from .errors import CallbackSignatureError
from .errors import HookError
from .errors import UnknownEventError
from .hookable import hookable
from .mixin import CallbackMixin
from .mixin import Hookable
from .registry import Handle

__all__ = [
    "CallbackMixin",
    "CallbackReturnError",
    "CallbackSignatureError",
    "Handle",
    "HookError",
    "Hookable",
    "USING_EXTENSION",
    "UnknownEventError",
    "hookable",
]

__version__ = "0.1.0"
