"""One benchmark run for the performance page, as JSON: ``hookwrap bench``'s numbers.

Runs the scenarios of ``python -m hookwrap bench`` (``hookwrap._bench.measure``:
each scenario timed alternately with a bare ``obj.step(batch)`` call, as a ratio to
it; the same callbacks through pluggy, blinker and ``nn.Module`` pre-hooks) and,
unless ``--no-step``, the training-step share of ``--step``, for the compiled
dispatch and for the pure twin, each in a fresh process of its own, and writes
them to one JSON file that ``tools/perf_tables.py`` turns into the page's tables::

    python tools/perf_run.py docs/performance/run.json   # --number=N calls per timing (20000)
    python tools/perf_tables.py --write docs/performance.md

A developer harness, not part of the installed package (``hookwrap bench`` prints
the same numbers as text).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def one(number: int, step: bool) -> dict[str, Any]:
    """This process's implementation: its ratios (``unit``: a bare call in seconds)."""
    import hookwrap as hw
    from hookwrap._bench import measure
    from hookwrap._bench.others import absent

    out: dict[str, Any] = {"extension": hw.USING_EXTENSION,
                           "ratios": measure(hw, number=number, others=True),
                           "absent": absent()}
    if step:
        from hookwrap._bench.step import measure_step

        out["step"] = measure_step()
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def run(number: int, step: bool) -> dict[str, Any]:
    twins: dict[str, Any] = {}
    for name, flag in (("compiled", ""), ("pure", "1")):
        env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS=flag)
        args = [sys.executable, __file__, "--one", str(number)] + (["--step"] if step else [])
        done = subprocess.run(args, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"perf_run: the {name} run failed:\n{done.stderr}")
        twins[name] = json.loads(done.stdout)
        if twins[name]["extension"] != (name == "compiled"):
            raise SystemExit(f"perf_run: expected the {name} dispatch, got the other (is hookwrap built?)")
    return {
        "command": f"python tools/perf_run.py (hookwrap._bench.measure, number={number})",
        "datetime": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"python": platform.python_version(), "implementation": platform.python_implementation(),
                    "processor": _cpu(), "cores": os.cpu_count(), "system": platform.system()},
        # The src/ tree survives a rebase, where the commit id does not: it names the code measured.
        "commit": {"id": _git("rev-parse", "HEAD"), "src_tree": _git("rev-parse", "HEAD:src"),
                   "dirty": bool(_git("status", "--porcelain", "--", "src"))},
        "twins": twins,
    }


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(json.dumps(one(int(argv[1]), "--step" in argv)))
        return 0
    paths = [a for a in argv if not a.startswith("--")]
    numbers = [int(a.split("=", 1)[1]) for a in argv if a.startswith("--number=")]
    if len(paths) != 1 or set(argv) - set(paths) - {"--no-step"} - {f"--number={n}" for n in numbers}:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(paths[0])
    number = numbers[-1] if numbers else 20000  # calls per timing, as hookwrap bench's --number
    result = run(number, step="--no-step" not in argv)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}; now: python tools/perf_tables.py --write docs/performance.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
