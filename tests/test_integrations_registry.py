"""hookwrap.integrations itself: importing it imports no framework, and PRESETS names
each preset's weave function for tools that look one up lazily."""

from __future__ import annotations

import importlib
import subprocess
import sys
from typing import Any

import pytest


def test_importing_hookwrap_and_the_registry_imports_no_framework(hw: Any) -> None:
    script = ("import sys, hookwrap, hookwrap.integrations as i; "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('torch', 'transformers', 'lightning', 'ignite', 'accelerate')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_presets_name_their_weave_functions(hw: Any) -> None:
    integrations = importlib.import_module("hookwrap.integrations")
    assert {"transformers", "lightning", "ignite", "accelerate"} <= set(integrations.PRESETS)
    for name in ("transformers", "lightning", "ignite", "accelerate"):
        assert integrations.PRESETS[name] == f"hookwrap.integrations.{name}:weave"
    with pytest.raises(hw.HookError, match=r"no preset 'lightnin'\. Did you mean 'lightning'"):
        integrations.load("lightnin")


@pytest.mark.third_party
def test_load_returns_the_weave_function(hw: Any) -> None:
    pytest.importorskip("ignite", reason="needs the thirdparty extra (pytorch-ignite)")
    integrations = importlib.import_module("hookwrap.integrations")
    weave = integrations.load("ignite")
    assert weave is importlib.import_module("hookwrap.integrations.ignite").weave
    with weave() as handle:
        assert handle.applied and "step" in handle.events
    assert not handle.applied
