"""Builds the compiled dispatch ``hookwrap._fast``, or falls back to the pure twin.

Where the extension cannot be built -- no compiler, a failing one, an interpreter
other than CPython, neither Cython nor the generated ``_fast.c`` -- the install
goes on with the pure Python twin (same behaviour, slower calls) and says so in
one line. ``HOOKWRAP_NO_EXTENSIONS=1`` at build time skips the extension (and
Cython) entirely. ``HOOKWRAP_REQUIRE_EXTENSIONS=1`` makes a failed build an error
instead of a fallback; CI sets it.

Cython runs when the extension is built or the sdist made, never when this file
is merely read (setuptools reads it to learn the build requirements, before
Cython is installed).
"""

import os
import platform
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

PYX = "src/hookwrap/_fast.pyx"
GENERATED_C = "src/hookwrap/_fast.c"  # made for the sdist: it builds without Cython
REQUIRED = bool(os.environ.get("HOOKWRAP_REQUIRE_EXTENSIONS"))


def _no_extensions():
    """HOOKWRAP_NO_EXTENSIONS set to anything but empty, 0, false, no or off (as at run time)."""
    return os.environ.get("HOOKWRAP_NO_EXTENSIONS", "").strip().lower() not in ("", "0", "false", "no", "off")


def fall_back(reason):
    if REQUIRED:
        sys.exit(f"hookwrap: the compiled dispatch could not be built ({reason}), and "
                 f"HOOKWRAP_REQUIRE_EXTENSIONS is set.")
    sys.stderr.write(f"hookwrap: installing the pure Python dispatch: {reason}.\n")


def generate_c():
    """Cythonize ``_fast.pyx`` into ``_fast.c``; False when Cython is missing."""
    try:
        from Cython.Build import cythonize
    except ImportError:
        return False
    cythonize([Extension("hookwrap._fast", [PYX])], compiler_directives={"language_level": "3"})
    return True


class OptionalBuildExt(build_ext):
    """Compiles from ``_fast.pyx`` (Cython) or the sdist's ``_fast.c``; any failure
    installs the pure twin instead of failing the install."""

    def run(self):
        if not self.extensions:
            return
        if not generate_c():
            c, pyx = Path(GENERATED_C), Path(PYX)
            if not c.exists() or c.stat().st_mtime < pyx.stat().st_mtime:
                fall_back("Cython is not installed and there is no up-to-date generated _fast.c")
                return
        for ext in self.extensions:
            ext.sources = [GENERATED_C]
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure to build means: fall back
            fall_back(f"building the extension failed ({type(exc).__name__}: {exc})")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            fall_back(f"compiling {ext.name} failed ({type(exc).__name__}: {exc})")


class SdistWithC(sdist):
    """The sdist carries the generated C (MANIFEST.in), so installing it needs no Cython."""

    def run(self):
        if not _no_extensions() and not generate_c():
            sys.exit("hookwrap: making the sdist needs Cython, to generate _fast.c.")
        super().run()


def extensions():
    if _no_extensions():
        return []  # asked for: the pure twin, nothing to report
    if platform.python_implementation() != "CPython":
        fall_back(f"the compiled dispatch is for CPython, not {platform.python_implementation()}")
        return []
    return [Extension("hookwrap._fast", [PYX])]


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt, "sdist": SdistWithC})
