"""Builds the compiled dispatch ``hookwrap._fast``, or falls back to the pure twin.

Where the extension cannot be built -- no compiler, a failing one, an interpreter
other than CPython, neither Cython nor the generated ``_fast.c`` -- the install
goes on with the pure Python twin (same behaviour, slower calls) and says so in
one line. ``HOOKWRAP_NO_EXTENSIONS=1`` at build time skips the extension (and
Cython) entirely. ``HOOKWRAP_REQUIRE_EXTENSIONS=1`` makes a failed build an error
instead of a fallback; CI sets it.
"""

import os
import platform
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PYX = "src/hookwrap/_fast.pyx"
GENERATED_C = "src/hookwrap/_fast.c"  # in an sdist: built without Cython
REQUIRED = bool(os.environ.get("HOOKWRAP_REQUIRE_EXTENSIONS"))


def fall_back(reason):
    if REQUIRED:
        sys.exit(f"hookwrap: the compiled dispatch could not be built ({reason}), and "
                 f"HOOKWRAP_REQUIRE_EXTENSIONS is set.")
    sys.stderr.write(f"hookwrap: installing the pure Python dispatch: {reason}.\n")


class OptionalBuildExt(build_ext):
    """A failed compile installs the pure twin instead of failing the install."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure to build means: fall back
            fall_back(f"building the extension failed ({type(exc).__name__}: {exc})")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            fall_back(f"compiling {ext.name} failed ({type(exc).__name__}: {exc})")


def extensions():
    if os.environ.get("HOOKWRAP_NO_EXTENSIONS"):
        fall_back("HOOKWRAP_NO_EXTENSIONS is set")
        return []
    if platform.python_implementation() != "CPython":
        fall_back(f"the compiled dispatch is for CPython, not {platform.python_implementation()}")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        if Path(GENERATED_C).exists():
            return [Extension("hookwrap._fast", [GENERATED_C])]
        fall_back("Cython is not installed and there is no generated _fast.c")
        return []
    return cythonize([Extension("hookwrap._fast", [PYX])],
                     compiler_directives={"language_level": "3"})


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
