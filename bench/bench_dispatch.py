"""Dispatch overhead with pytest-benchmark (pluggy's testing/benchmark.py is the model).

Run: ``python -m pytest bench --benchmark-enable`` (the test run keeps them
correct with benchmarks disabled). Compare ratios within one run: the
``bare method`` row is the unit. ``python -m hookwrap bench`` prints the same
scenarios as a ratio table without pytest.
"""

from __future__ import annotations

import importlib

import pytest

from hookwrap._bench import KS, REGISTRATION_CYCLE
from hookwrap._bench.others import SYSTEMS, absent, other_scenarios

NAMES = (
    ["bare method", "bare function", "functools.wraps closure", "wrapt.decorator pass-through",
     "bare classmethod", "hookwrap k=0, a sibling has callbacks"]
    + [f"hand loop k={k}" for k in KS]
    + [f"hand wrap k={k}" for k in KS]
    + [f"hand loop every=2 k={k}" for k in KS]
    + [f"hookwrap {kind} k={k}" for kind in ("pre", "post", "around", "pre every=2", "pre via reader",
                                             "function pre", "classmethod pre") for k in KS]
    + [REGISTRATION_CYCLE]
    + [f"{kind} k={k}" for kind in ("hand emit loop", "hookwrap emit") for k in KS]
)


@pytest.fixture(scope="module")
def calls(hw_module):
    bench = importlib.import_module("hookwrap._bench")
    scenarios = bench.scenarios(hw_module)
    return {name: bench.as_callable(scenario) for name, scenario in scenarios.items()}


@pytest.mark.parametrize("name", NAMES)
def bench_dispatch(benchmark, calls, name):
    call = calls[name]
    expected = call()  # every scenario passes the batch through unchanged; emit returns None
    result = benchmark(call)
    assert result == expected == (None if "emit" in name else [1, 2, 3])


@pytest.fixture(scope="module")
def other_calls(hw_module):
    bench = importlib.import_module("hookwrap._bench")
    return {name: bench.as_callable(scenario)
            for name, scenario in other_scenarios(hw_module, KS).items()}


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("k", KS)
def bench_other_hook_systems(benchmark, other_calls, system, k):
    """The same k callbacks through pluggy, blinker and nn.Module pre-hooks (and
    hookwrap on the same module), each skipped with its reason where absent."""
    if system in absent():
        pytest.skip(absent()[system])
    call = other_calls[f"{system} k={k}"]
    result = benchmark(call)
    if system == "pluggy":
        assert result == [[1, 2, 3]] * k  # every plugin ran, in the hook's result list
    elif system == "blinker":
        assert [value for _, value in result] == [[1, 2, 3]] * k
    else:
        assert result == [1, 2, 3]
