"""The README's examples run and print what the README says; the demo trains."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as _f:
    README = _f.read()
EXAMPLES = re.findall(r"```python\n(.*?)```\n\n```text\n(.*?)```", README, flags=re.S)
# Examples that import a third-party trainer (the thirdparty extra) are third_party
# tests: CI runs them with that extra installed (pytest -m third_party).
FRAMEWORKS = ("transformers", "lightning", "ignite", "accelerate")


def _frameworks(code: str) -> list[str]:
    return [name for name in FRAMEWORKS if re.search(rf"^(from|import) {name}\b", code, flags=re.M)]


def test_readme_has_examples():
    assert len(EXAMPLES) >= 4
    assert {name for code, _ in EXAMPLES for name in _frameworks(code)} == set(FRAMEWORKS)


@pytest.mark.parametrize("index", [
    pytest.param(i, marks=[pytest.mark.third_party] if _frameworks(code) else [])
    for i, (code, _) in enumerate(EXAMPLES)
])
def test_readme_example_prints_what_the_readme_shows(hw, index):
    code, expected = EXAMPLES[index]
    if "torch" in code:  # hookwrap.torch's examples need the torch extra
        pytest.importorskip("torch", reason="the torch extra is not installed")
    for name in _frameworks(code):
        pytest.importorskip(name, reason="needs the thirdparty extra")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "example.py", "exec"), {"__name__": f"readme_{index}"})
    assert out.getvalue() == expected


def test_demo_command_refuses_an_unknown_command():
    bad = subprocess.run([sys.executable, "-m", "hookwrap", "nope"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'nope'" in bad.stderr
