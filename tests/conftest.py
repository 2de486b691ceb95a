"""Every test runs against both dispatch implementations in one pytest run.

The ``hw`` fixture re-imports hookwrap with ``HOOKWRAP_NO_EXTENSIONS`` set or
unset (ids ``c-extension-module`` / ``pure-python-module``). Tests define their
classes inside the test, from the ``hw`` they were given.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Iterator

import pytest

IMPLEMENTATIONS = {"c-extension-module": "", "pure-python-module": "1"}

# Kept across re-imports: the compiled module is loaded once per process and
# raises these classes, so the re-imported package must share them.
_KEEP = {"hookwrap.errors", "hookwrap._fast"}


def load_hookwrap(no_extensions: str) -> Any:
    for name in [m for m in sys.modules if m == "hookwrap" or m.startswith("hookwrap.")]:
        if name not in _KEEP:
            del sys.modules[name]
    saved = os.environ.get("HOOKWRAP_NO_EXTENSIONS")
    os.environ["HOOKWRAP_NO_EXTENSIONS"] = no_extensions
    try:
        return importlib.import_module("hookwrap")
    finally:
        if saved is None:
            del os.environ["HOOKWRAP_NO_EXTENSIONS"]
        else:
            os.environ["HOOKWRAP_NO_EXTENSIONS"] = saved


@pytest.fixture(scope="session", params=list(IMPLEMENTATIONS), ids=list(IMPLEMENTATIONS))
def hw_module(request: pytest.FixtureRequest) -> Iterator[Any]:
    hw = load_hookwrap(IMPLEMENTATIONS[request.param])
    if request.param == "c-extension-module" and not hw.USING_EXTENSION:
        if os.environ.get("HOOKWRAP_REQUIRE_EXTENSIONS"):
            pytest.fail("the compiled hookwrap._fast did not load (HOOKWRAP_REQUIRE_EXTENSIONS is set)")
        pytest.skip("hookwrap._fast is not built")
    yield hw


@pytest.fixture
def hw(hw_module: Any) -> Any:
    return hw_module


@pytest.fixture
def renames(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """``(source, destination)`` file names of each ``os.replace`` from now on, each
    checked to be a rename of an existing file within one folder (an atomic write)."""
    made: list[tuple[str, str]] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        assert os.path.exists(src) and os.path.dirname(src) == os.path.dirname(dst)
        made.append((os.path.basename(src), os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    return made
