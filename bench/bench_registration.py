"""Registration and ordering cost with pytest-benchmark (issue 32, item 3).

Run: ``python -m pytest bench/bench_registration.py --benchmark-enable``. Each round
registers, on a fresh class and object, N callbacks on one event, then calls it
once (where the chain is ordered), then removes them:

* ``400 chained before=``: each callback ``before=`` the previous one (also
  ``after=`` and by name): was cubic (13.6 s for 400 on the instance tier);
* ``10,000 plain``: no ordering options: was quadratic (13.5 s for 10,000).

Both are linear now: 400 chained take a few tens of milliseconds, and 10,000
plain about ten times what 1,000 take. ``tests/core/test_ordering_scale.py`` counts
the property (no timing there).
"""

from __future__ import annotations

from typing import Any

import pytest

SCENARIOS = {
    "400 chained before=": (400, "before"),
    "400 chained after=": (400, "after"),
    "400 chained before= by name": (400, "name"),
    "1,000 plain": (1000, None),
    "10,000 plain": (10000, None),
}
TIERS = ("instance", "class", "global")


def callbacks(n: int) -> list[Any]:
    fns = []
    for i in range(n):
        def cb(self: Any) -> None:
            pass
        cb.__name__ = cb.__qualname__ = f"cb{i}"
        fns.append(cb)
    return fns


def setup_round(hw: Any, n: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self) -> int:
            return 1

    return (Trainer, Trainer(), callbacks(n)), {}


def register_all(hw: Any, tier: str, shape: str | None, cls: Any, obj: Any, fns: list[Any]) -> list[Any]:
    handles = []
    for i, fn in enumerate(fns):
        opts: dict[str, Any] = {}
        if i and shape == "before":
            opts["before"] = fns[i - 1]
        elif i and shape == "after":
            opts["after"] = fns[i - 1]
        elif i and shape == "name":
            opts["before"] = f"cb{i - 1}"
        if tier == "instance":
            handles.append(obj.before("step", fn, **opts))
        elif tier == "class":
            handles.append(hw.before(cls, "step", fn, **opts))
        else:
            handles.append(hw.register_global_callback(("pre-step", fn), **opts))
    return handles


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def bench_registration(benchmark, hw_module, tier, scenario):
    n, shape = SCENARIOS[scenario]
    hw = hw_module
    done: list[Any] = []

    def run(cls: Any, obj: Any, fns: list[Any]) -> int:
        handles = register_all(hw, tier, shape, cls, obj, fns)
        result = obj.step()  # the chain is built, and ordered, once here
        for handle in handles:
            handle.remove()
        done.append(len(handles))
        return result  # type: ignore[no-any-return]

    result = benchmark.pedantic(run, setup=lambda: setup_round(hw, n), rounds=3, iterations=1)
    assert result == 1 and done and set(done) == {n}
