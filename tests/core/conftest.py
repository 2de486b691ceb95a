"""Fixtures of the hook library's tests (join points, tiers, advice, dispatch,
registration, the CLI, the documentation)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest


@pytest.fixture
def ext(hw: Any) -> Any:
    """hookwrap.extend, imported from the implementation under test."""
    return importlib.import_module("hookwrap.extend")
