"""The build backend: setuptools', asking for Cython only when it will be used.

Cython turns ``_fast.pyx`` into C. It is not needed to build from an sdist (which
carries the generated ``_fast.c``), nor with ``HOOKWRAP_NO_EXTENSIONS=1`` (the
pure twin only), so a machine without it, or without a compiler, still installs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - every hook not redefined below

CYTHON = "Cython>=3.0"
_PACKAGE = Path(__file__).resolve().parent.parent / "src" / "hookwrap"


def _no_extensions():
    """HOOKWRAP_NO_EXTENSIONS set to anything but empty, 0, false, no or off (as at run time)."""
    return os.environ.get("HOOKWRAP_NO_EXTENSIONS", "").strip().lower() not in ("", "0", "false", "no", "off")


def _cython_needed(sdist: bool = False) -> bool:
    if _no_extensions():
        return False
    generated, source = _PACKAGE / "_fast.c", _PACKAGE / "_fast.pyx"
    # A checkout's _fast.c may predate an edit of _fast.pyx: regenerate it then.
    fresh = generated.exists() and generated.stat().st_mtime >= source.stat().st_mtime
    return sdist or not fresh


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    requires = _setuptools.get_requires_for_build_wheel(config_settings)
    return requires + [CYTHON] if _cython_needed() else requires


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    requires = _setuptools.get_requires_for_build_editable(config_settings)
    return requires + [CYTHON] if _cython_needed() else requires


def get_requires_for_build_sdist(config_settings: Any = None) -> list[str]:
    # The sdist carries _fast.c, generated now, so installing it needs no Cython.
    requires = _setuptools.get_requires_for_build_sdist(config_settings)
    return requires + [CYTHON] if _cython_needed(sdist=True) else requires
