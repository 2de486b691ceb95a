"""The README's examples run and print what the README says; the demo trains."""

from __future__ import annotations

import contextlib
import importlib
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


def test_readme_has_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_prints_what_the_readme_shows(hw, index):
    code, expected = EXAMPLES[index]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "example.py", "exec"), {"__name__": f"readme_{index}"})
    assert out.getvalue() == expected


def test_demo_trains_and_every_callback_reports(hw):
    demo = importlib.import_module("hookwrap.demo")
    lines: list[str] = []
    trainer = demo.run(out=lines.append)
    assert abs(trainer.w - 3) < 0.2 and abs(trainer.b - 1) < 0.3
    assert sum("post-epoch   epoch" in line for line in lines) == 6
    assert sum("checkpoint saved" in line for line in lines) == 3
    assert "halves the loss scale" in lines[0]
    assert lines[-1].endswith("compiled" if hw.USING_EXTENSION else "pure Python")


def test_demo_command_runs():
    out = subprocess.run([sys.executable, "-m", "hookwrap", "demo"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    assert "trained: w=" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "hookwrap", "nope"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'nope'" in bad.stderr
