"""``python -m hookwrap bench`` runs and prints its table (no timing is asserted:
speed goals live in bench/, and these machines are noisy)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

# Developer harnesses (callgrind): in the repository, not in the installed package.
TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_tools_{name}", TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ratio_table_has_every_scenario_and_the_slopes(hw):
    bench = importlib.import_module("hookwrap._bench")
    results = bench.measure(hw, number=20, repeat=1)
    assert set(results) == set(bench.scenarios(hw)) | {"unit"}
    assert results["unit"] > 0 and all(r > 0 for r in results.values())
    text = bench.table(results, "test")
    assert "bare method" in text and "1.00x" in text
    for prefix in ["hand loop", "hookwrap pre", "hookwrap around", "hookwrap pre every=2"]:
        assert f"  {prefix:<36}" in text


def test_every_scenario_really_calls_through_the_hooks(hw):
    bench = importlib.import_module("hookwrap._bench")
    scenarios = bench.scenarios(hw)
    for name, scenario in scenarios.items():
        expected = None if "emit" in name else [1, 2, 3]  # emit returns nothing
        assert bench.as_callable(scenario)() == expected, name
    for k in bench.KS:  # the emitters hold k listeners, the hand loops k functions
        assert len(scenarios[f"hookwrap emit k={k}"][1]["obj"].callbacks) == k
        assert len(scenarios[f"hand emit loop k={k}"][1]["obj"].fns) == k


def test_bench_command_current_implementation_only():
    out = subprocess.run([sys.executable, "-m", "hookwrap", "bench", "--number", "20", "--current-only"],
                         capture_output=True, text=True, check=True)
    assert "ratios to a bare obj.step(batch) call" in out.stdout
    assert "per-callback cost" in out.stdout


@pytest.mark.parametrize("number", ["0", "-5", "many"])
def test_bench_refuses_a_number_of_calls_that_is_no_count(number):
    out = subprocess.run([sys.executable, "-m", "hookwrap", "bench", "--number", number, "--current-only"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "argument --number:" in out.stderr
    assert ("must be at least 1" if number != "many" else "expected a whole number") in out.stderr


def test_step_report_needs_torch_or_says_so():
    try:
        import torch  # noqa: F401
    except ImportError:
        out = subprocess.run([sys.executable, "-m", "hookwrap", "bench", "--step", "--current-only"],
                             capture_output=True, text=True)
        assert out.returncode == 2 and "needs torch" in out.stderr
        return
    step = importlib.import_module("hookwrap._bench.step")
    text = step.report(number=5)
    assert "8 join points x 2 callbacks" in text and "overhead / step" in text


def test_step_loop_fires_every_callback(hw):
    step = importlib.import_module("hookwrap._bench.step")
    cls = step._hooked_class(hw)
    calls = []
    for event in step.EVENTS:
        hw.after(cls, event, lambda self, event=event: calls.append(event))
    obj = cls(step._NoOps())
    obj.train_step(obj.ops.batch)
    assert sorted(calls) == sorted(step.EVENTS)
    described = hw.describe(obj)
    assert all(len(described.chains[e]) == 3 for e in step.EVENTS)


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice


def test_instruction_scenarios_call_through_the_hooks():
    """Each scenario tools/bench_instructions.py counts under callgrind returns the
    batch and runs its callbacks (each in a process of its own: one registers
    a global callback). Counting itself needs valgrind and minutes: not here."""
    instructions = _tool("bench_instructions")
    assert len({name for name, _ in instructions.ROWS}) == len(instructions.ROWS)
    rows = instructions.ROWS + [row for row in instructions.SWEEP if row not in instructions.ROWS]
    for name, base in rows:  # the --sweep ones too: k callbacks run k times
        assert base is None or base in dict(rows), name
        subprocess.run([sys.executable, str(TOOLS / "bench_instructions.py"), "--check", name],
                       check=True, capture_output=True, text=True)
    with pytest.raises(KeyError):
        instructions.setup("no such scenario")


def test_step_loops_counted_by_callgrind_run_and_unknown_ones_fail():
    """tools/callgrind_step.sh runs these loops (tools/bench_step.py) under callgrind; each runs here
    (the no-op ones without torch), and a misspelt one is refused by name."""
    kinds = ["plain-noop", "hooked-noop", "hand-noop"]
    try:
        import torch  # noqa: F401
        kinds += ["plain", "hooked", "hand"]
    except ImportError:
        pass
    for kind in kinds:
        subprocess.run([sys.executable, str(TOOLS / "bench_step.py"), kind, "2"],
                       check=True, capture_output=True, text=True)
    out = subprocess.run([sys.executable, str(TOOLS / "bench_step.py"), "hooked-nop", "2"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "unknown loop 'hooked-nop'" in out.stderr
