"""Fixtures of the tests of hookwrap.torch's shipped callbacks. torch is imported
by the test modules (each skips where it is not installed), never here."""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest


@pytest.fixture
def ht(hw: Any) -> Any:
    """hookwrap.torch, imported from the implementation under test."""
    return importlib.import_module("hookwrap.torch")


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
