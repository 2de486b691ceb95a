"""Every test runs against both dispatch implementations in one pytest run.

The tests are in three layers, each folder with the fixtures it alone uses in its
own conftest.py: ``core/`` (the hook library), ``torch/`` (the shipped callbacks
of ``hookwrap.torch``) and ``integrations/`` (the presets for third-party
trainers). The fixtures every layer uses are here.

The ``hw`` fixture re-imports hookwrap with ``HOOKWRAP_NO_EXTENSIONS`` set or
unset (ids ``c-extension-module`` / ``pure-python-module``). Tests define their
classes inside the test, from the ``hw`` they were given.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any, Iterator

import pytest

IMPLEMENTATIONS = {"c-extension-module": "", "pure-python-module": "1"}

# DeepSpeed, where installed (transformers and accelerate import it when they set up
# a run), finds no GPU here and says so on stdout, in the output a docs example
# prints: named, it sets up its CPU accelerator quietly, as on a CPU machine one does.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

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
        module = importlib.import_module("hookwrap")
        _LOADED.append(sys.modules["hookwrap._callback"])
        return module
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


@pytest.fixture(autouse=True)
def _nothing_held_across_tests() -> Iterator[None]:
    """What a test's deferring callbacks still hold when it ends is delivered then,
    its errors dropped: each test is a process of its own, whose leftovers neither
    reach the next test's boundaries (the end of any fit settles what it drove) nor
    fail this process's exit (a NaN found at exit makes the status 1)."""
    yield
    modules = {id(m): m for m in (sys.modules.get("hookwrap._callback"), *_LOADED) if m is not None}
    for module in modules.values():
        for cb in module.deferring_callbacks():
            with contextlib.suppress(BaseException):
                if cb.pending():
                    cb.settle(None, module.Ending("removed"))


_LOADED: list[Any] = []  # each hookwrap._callback the hw fixture loaded
