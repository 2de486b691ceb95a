"""Builds the compiled dispatch ``hookwrap._fast`` from ``src/hookwrap/_fast.pyx``.

``HOOKWRAP_NO_EXTENSIONS=1`` at build time skips it (the pure twin is used).
``HOOKWRAP_REQUIRE_EXTENSIONS=1`` makes a failed build an error instead of a
silent fallback; CI sets it.
"""

import os

from setuptools import Extension, setup

extensions = []
if not os.environ.get("HOOKWRAP_NO_EXTENSIONS"):
    from Cython.Build import cythonize

    required = bool(os.environ.get("HOOKWRAP_REQUIRE_EXTENSIONS"))
    extensions = cythonize(
        [Extension("hookwrap._fast", ["src/hookwrap/_fast.pyx"], optional=not required)],
        compiler_directives={"language_level": "3"},
    )

setup(ext_modules=extensions)
