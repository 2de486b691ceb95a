"""Run one training-step loop of ``hookwrap bench --step`` for a fixed number of
steps: what ``tools/callgrind_step.sh`` counts instructions of under callgrind.

    python tools/bench_step.py KIND N

KIND is ``plain``, ``hooked`` or ``hand`` (the callbacks called by hand), with
real torch bodies, or with no-op bodies as ``plain-noop``, ``hooked-noop``,
``hand-noop``. A developer harness: it is not part of the installed package;
the loops themselves are (``hookwrap._bench.step``).
"""

from __future__ import annotations

import sys


def run_steps(kind: str, n: int) -> None:
    """Run ``n`` steps (after 20 warm-up steps) of the loop ``kind``."""
    import hookwrap as hw
    from hookwrap._bench.step import _Bodies, _HandWritten, _hooked_class, _NoOps, _TorchOps

    loop, _, bodies = kind.partition("-")
    classes = {"plain": _Bodies, "hand": _HandWritten, "hooked": None}
    if loop not in classes or bodies not in ("", "noop"):
        raise SystemExit(f"bench_step: unknown loop {kind!r}; expected plain, hooked or hand, "
                         f"each optionally with -noop")
    ops = _NoOps() if bodies else _TorchOps()
    obj = (classes[loop] or _hooked_class(hw))(ops)
    for _ in range(20 + n):
        obj.train_step(ops.batch)


if __name__ == "__main__":
    run_steps(sys.argv[1], int(sys.argv[2]))
