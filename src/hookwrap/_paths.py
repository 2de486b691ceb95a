"""Relative paths given on ``hookwrap run``'s command line: they name files in the
folder the command ran in, wherever the script ``os.chdir``s to before a callback
opens them. While ``hookwrap run`` builds its ``--callback`` objects
(``relative_to``), the shipped callbacks taking a path (``Checkpoint``,
``BestCheckpoint``, ``MetricsLogger``, ``Profiler``) make a relative one absolute
(``anchored``); anywhere else a path is left as given, as Python's ``open`` takes it.

It imports nothing of hookwrap, so every module can import it."""

from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar
from typing import Any, Iterator

__all__ = ["anchored", "relative_to"]

_FOLDER: ContextVar[str | None] = ContextVar("hookwrap_paths_relative_to", default=None)


@contextlib.contextmanager
def relative_to(folder: str) -> Iterator[None]:
    """Within the block, ``anchored`` makes relative paths absolute against ``folder``."""
    token = _FOLDER.set(os.path.abspath(folder))
    try:
        yield
    finally:
        _FOLDER.reset(token)


def anchored(value: Any) -> Any:
    """``value`` (a path, str or ``os.PathLike``) as absolute against the folder of
    ``relative_to`` when inside one and relative (a URL, with ``:``, is left as it is);
    else ``value`` itself. A str stays a str; a ``PathLike`` becomes a str."""
    folder = _FOLDER.get()
    if folder is None or not isinstance(value, (str, os.PathLike)):
        return value
    text = os.fspath(value)
    if not isinstance(text, str) or not text or os.path.isabs(text) or ":" in text.split("/")[0]:
        return value
    return os.path.join(folder, text)
