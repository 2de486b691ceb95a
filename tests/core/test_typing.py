"""Type checkers see a join point's own signature, bound like a method, with the
registration verbs and ``__wrapped__``; the package and the documentation's
examples (README.md, docs/) pass ``mypy --strict``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = '''
import hookwrap as hw

class Trainer(hw.Hookable):
    @hw.hookable
    def step(self, batch: list[int], scale: float = 1.0) -> float:
        return sum(batch) * scale

    @hw.hookable("loss")
    def compute_loss(self, batch: list[int]) -> int:
        return len(batch)

    @hw.hookable
    @classmethod
    def build(cls, n: int) -> int:
        return n

@hw.hookable
def train_step(model: str, batch: int) -> str:
    return model * batch

def log(self: Trainer, batch: list[int]) -> None:
    print(batch)

handle: hw.Handle = Trainer.step.before(log)
train_step.after(lambda return_value: return_value)
Trainer.compute_loss.around(lambda self, proceed, batch: proceed(batch))
train_step.on_error(lambda exception: None)
reveal_type(Trainer().step)
reveal_type(train_step)
reveal_type(train_step.__wrapped__)
reveal_type(Trainer().compute_loss([1]))
reveal_type(Trainer.build(2) + Trainer().build(3))
description: hw.Description = hw.describe(Trainer)
weaving: hw.WeaveHandle = hw.weave(Trainer, "compute_loss")
Trainer().step("oops")
'''


def _mypy(tmp_path: Path, *args: str) -> str:
    pytest.importorskip("mypy")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir",
         str(tmp_path / "cache"), *args],
        cwd=ROOT, capture_output=True, text=True,
    )
    return out.stdout + out.stderr


def test_join_points_keep_their_signature_and_gain_the_verbs(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(SAMPLE)
    text = _mypy(tmp_path, str(sample))
    revealed = re.findall(r'Revealed type is "(.*)"', text)
    assert revealed == [
        "def (batch: builtins.list[builtins.int], scale: builtins.float =) -> builtins.float",
        "hookwrap._hookable.HookableCallable[[model: builtins.str, batch: builtins.int], builtins.str]",
        "def (model: builtins.str, batch: builtins.int) -> builtins.str",
        "builtins.int",
        "builtins.int",
    ] or revealed == [
        "def (batch: list[int], scale: float =) -> float",
        "hookwrap._hookable.HookableCallable[[model: str, batch: int], str]",
        "def (model: str, batch: int) -> str",
        "int",
        "int",
    ], text
    # The one error is the sample's own: a wrong argument to a join point.
    assert text.count("error:") == 1 and 'incompatible type "str"; expected "list[int]"' in text, text


def test_the_package_passes_mypy_strict(tmp_path):
    text = _mypy(tmp_path, str(ROOT / "src" / "hookwrap"))
    assert "Success: no issues found" in text, text


def test_the_docs_examples_pass_mypy_strict(tmp_path):
    # README.md and every page of docs/ but the design contract, whose blocks are
    # sketches of the API (tests/core/test_docs.py runs the same examples).
    pages = [ROOT / "README.md"] + sorted(
        p for p in (ROOT / "docs").rglob("*.md") if p != ROOT / "docs" / "design" / "contract.md")
    examples = [code for page in pages
                for code in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)]
    assert len(examples) >= 21
    if importlib.util.find_spec("torch") is None:
        # Without torch its classes are Any to mypy, and strict refuses subclassing
        # Any; those examples are checked where the torch extra is installed.
        examples = [code for code in examples if "nn.Module" not in code]
    # Likewise a framework of the thirdparty extra, or a logger of the loggers extra,
    # where it is not installed.
    for framework in ("lightning", "transformers", "ignite", "accelerate", "mlflow", "wandb"):
        if importlib.util.find_spec(framework) is None:
            examples = [code for code in examples
                        if not re.search(rf"^(from|import) {framework}\b", code, flags=re.M)]
    for i, code in enumerate(examples):
        (tmp_path / f"docs_example_{i}.py").write_text(code)
    text = _mypy(tmp_path, *sorted(str(p) for p in tmp_path.glob("docs_example_*.py")))
    assert "Success: no issues found" in text, text
