"""Type checkers see a decorated function's own signature (and hookwrap type-checks)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
def train_step(model: str, batch: int) -> str:
    return model * batch

reveal_type(Trainer().step)
reveal_type(train_step)
Trainer().step("oops")
'''


def test_decorated_signatures_reach_the_type_checker(tmp_path):
    pytest.importorskip("mypy")
    sample = tmp_path / "sample.py"
    sample.write_text(SAMPLE)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(sample)],
        cwd=ROOT, capture_output=True, text=True,
    )
    text = out.stdout
    assert 'Revealed type is "def (batch: builtins.list[builtins.int], scale: builtins.float =) -> builtins.float"' in text or \
        'Revealed type is "def (batch: list[int], scale: float =) -> float"' in text, text
    assert "def (model: builtins.str, batch: builtins.int) -> builtins.str" in text or \
        'def (model: str, batch: int) -> str' in text, text
    assert 'Argument 1 to "step" of "Trainer" has incompatible type "str"' in text, text
    # hookwrap's own modules type-check cleanly: the only error is the sample's.
    assert text.count("error:") == 1, text
