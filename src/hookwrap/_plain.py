"""Plain data: what a callback's saved state may hold, so that every file carrying it
loads with ``torch.load(weights_only=True)`` and nothing handed back to a callback
was made by running code from a file (see docs/design/decisions.md, "What hookwrap
reads").

It imports only ``errors``, so every module can import it."""

from __future__ import annotations

import re
import sys
from collections import OrderedDict
from typing import Any

from .errors import HookError

__all__ = ["check_plain", "not_plain", "weights_only_load"]

_SCALARS = (str, bytes, int, float, complex, bool, type(None))
_TORCH_PLAIN = ("Tensor", "Parameter", "Size", "dtype", "device", "layout", "memory_format")


def _is_torch_plain(value: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    kinds = tuple(kind for kind in (getattr(torch, name, None) for name in _TORCH_PLAIN) if isinstance(kind, type))
    return isinstance(value, kinds)


def not_plain(value: Any, where: str = "") -> tuple[str, Any] | None:
    """The first part of ``value`` that is not plain data, as (where in it, the part):
    plain is dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None and
    torch tensors (with their dtypes, devices and sizes), nested. None when all is."""
    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:
        at, item = stack.pop()
        if isinstance(item, _SCALARS) and type(item) in _SCALARS:
            continue
        if type(item) in (dict, OrderedDict):
            for key, part in item.items():
                if not (type(key) in _SCALARS):
                    return f"{at}[{key!r}] (a key)", key
                stack.append((f"{at}[{key!r}]", part))
            continue
        if type(item) in (list, tuple, set, frozenset):
            stack.extend((f"{at}[{i}]", part) for i, part in enumerate(item))
            continue
        if _is_torch_plain(item):
            continue
        return at, item
    return None


def check_plain(value: Any, where: str, what: str) -> None:
    """Refuse ``value`` (``what``: the state in ``where``) unless it is plain data,
    with a HookError naming the part that is not and the fix."""
    found = not_plain(value)
    if found is None:
        return
    at, part = found
    raise HookError(f"{where}: {what} holds {type(part).__module__}.{type(part).__qualname__} at {at or 'its top'}, "
                    f"not plain data (dicts, lists, numbers, strings, None, tensors). "
                    f"A callback's state_dict() returns plain data, so that a checkpoint loads with "
                    f"torch.load(weights_only=True) and runs no code: load only checkpoints you trust, and "
                    f"make your callback's state_dict() return plain values.")


def weights_only_load(source: Any, name: str, map_location: Any = None) -> Any:
    """``torch.load(source, weights_only=True)``: tensors and plain data (dicts, lists,
    numbers, strings), never an object whose unpickling runs code. A file holding
    anything else is a HookError naming it (``name``), what torch found, and the way
    out; hookwrap never loads one with ``weights_only=False``."""
    import pickle

    import torch

    try:
        return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        match = re.search(r"WeightsUnpickler error: ([^\n]*?)(?:\. Please|\n|$)", str(exc))
        said = match.group(1) if match else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise HookError(f"hookwrap: {name!r} holds more than tensors and plain data ({said}), and hookwrap "
                        f"reads its files with torch.load(weights_only=True), which runs no code from them; "
                        f"nothing was loaded. It was not written by hookwrap (or was changed since): load "
                        f"only files you trust, and if you wrote this one yourself, save plain data "
                        f"(state_dict()s, lists, numbers) instead of objects.") from None
