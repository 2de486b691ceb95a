"""Fixtures of the tests of hookwrap.integrations: the presets for third-party
trainers and the ArcticTraining drop-in. No framework is imported here."""

from __future__ import annotations

import importlib
from typing import Any

import pytest


@pytest.fixture
def preset(hw: Any, request: pytest.FixtureRequest) -> Any:
    """The preset module that ``test_<preset>.py`` tests (``<preset>`` a name in
    ``hookwrap.integrations.PRESETS``), imported from the implementation under test."""
    name = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    integrations = importlib.import_module("hookwrap.integrations")
    return importlib.import_module(integrations.PRESETS[name].partition(":")[0])
