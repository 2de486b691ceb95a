"""The performance page's tables, made from a benchmark run instead of copied by hand.

Reads the JSON of one run of ``tools/perf_run.py`` (``hookwrap bench``'s
scenarios for both dispatch twins, the other hook systems and the training-step
share) and the counts of ``tools/bench_instructions.py --json`` (callgrind), and
writes the markdown tables between the marker comments of ``docs/performance.md``::

    <!-- perf-tables:begin NAME -->
    ...generated: edit the script or the run, not this...
    <!-- perf-tables:end NAME -->

Regenerate (from a checkout with the torch and test extras installed; valgrind
for the instruction counts)::

    python tools/perf_run.py docs/performance/run.json
    python tools/bench_instructions.py --json docs/performance/instructions-compiled.json
    python tools/bench_instructions.py --pure --json docs/performance/instructions-pure.json
    python tools/callback_costs.py --json docs/performance/callback-costs.json
    python tools/framework_costs.py --json docs/performance/framework-costs.json
    python tools/perf_tables.py --write docs/performance.md

``--check PAGE`` exits 1 when the page's tables differ from what the committed
JSON gives (tests/core/test_perf_tables.py asserts the same); with no argument it
prints the tables. A developer tool: not part of the installed package, and it
imports nothing of it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "performance.md"
RUN = ROOT / "docs" / "performance" / "run.json"
INSTRUCTIONS = {"compiled": ROOT / "docs" / "performance" / "instructions-compiled.json",
                "pure": ROOT / "docs" / "performance" / "instructions-pure.json"}
CALLBACK_COSTS = ROOT / "docs" / "performance" / "callback-costs.json"
FRAMEWORK_COSTS = ROOT / "docs" / "performance" / "framework-costs.json"
FRAMEWORK_NAMES = {"lightning": ("Lightning `Trainer.fit`", "Lightning `Callback`s"),
                   "ignite": ("ignite `Engine.run`", "ignite event handlers"),
                   "transformers": ("HF `Trainer.train`", "HF `TrainerCallback`s")}
TWINS = {"compiled": "compiled", "pure": "pure Python twin"}
KS = (0, 1, 4, 16)
MARKER = re.compile(r"(<!-- perf-tables:begin (\S+) -->\n)(.*?)(<!-- perf-tables:end \2 -->)", re.S)


def _slope(t: dict[str, float], prefix: str) -> float:
    """Bare calls per added callback: least squares over every k, as ``hookwrap bench``."""
    ys = [t[f"{prefix} k={k}"] for k in KS]
    mx, my = sum(KS) / len(KS), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(KS, ys)) / sum((x - mx) ** 2 for x in KS)


def _ns(seconds: float) -> str:
    return f"{seconds * 1e9:,.0f} ns"


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- the tables ----------------------------------------------------------------------

def about(run: dict[str, Any]) -> str:
    m, commit = run["machine"], run["commit"]
    return (f"From one run of `{run['command']}`, {run['datetime']}: {m['implementation']} {m['python']} "
            f"on {m['system']}, {m['processor']}, {m['cores']} cores shared with other work; "
            f"src/ as in git tree {str(commit.get('src_tree') or commit['id'])[:10]} (`git rev-parse HEAD:src`)"
            f"{' with local changes' if commit['dirty'] else ''}.\n")


def _ratios(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {TWINS[twin]: data["ratios"] for twin, data in run["twins"].items()}


def dispatch_table(run: dict[str, Any]) -> str:
    twins = _ratios(run)

    def row(label: str, f: Any) -> list[str]:
        return [label] + [f(t) for t in twins.values()]

    def ns(ratio: float, t: dict[str, float]) -> str:
        return _ns(ratio * t["unit"])

    rows = [
        row("a bare `obj.step(batch)` call: the unit", lambda t: _ns(t["unit"])),
        row("nothing registered: method", lambda t: _x(t["hookwrap pre k=0"])),
        row("nothing registered: method, when other instances of its class have callbacks",
            lambda t: _x(t["hookwrap k=0, a sibling has callbacks"])),
        row("nothing registered: plain function, vs a bare function call",
            lambda t: _x(t["hookwrap function pre k=0"] / t["bare function"])),
        row("nothing registered: classmethod, vs a bare classmethod call",
            lambda t: _x(t["hookwrap classmethod pre k=0"] / t["bare classmethod"])),
        row("each pre callback (slope over k = 0, 1, 4, 16), vs a hand-written loop's slope",
            lambda t: _x(_slope(t, "hookwrap pre") / _slope(t, "hand loop"))),
        row("each post callback taking `return_value`, same",
            lambda t: _x(_slope(t, "hookwrap post") / _slope(t, "hand loop"))),
        row("each `every=2` callback, vs a hand-written per-callback `count % 2` check",
            lambda t: _x(_slope(t, "hookwrap pre every=2") / _slope(t, "hand loop every=2"))),
        row("each shipped callback (`hookwrap.torch`: a reader, then its method)",
            lambda t: ns(_slope(t, "hookwrap pre via reader"), t)),
        row("each plain pre callback, for comparison", lambda t: ns(_slope(t, "hookwrap pre"), t)),
        row("each around advice", lambda t: ns(_slope(t, "hookwrap around"), t)),
        row("each around advice, vs a hand-written closure calling the method",
            lambda t: _x(_slope(t, "hookwrap around") / _slope(t, "hand wrap"))),
        row("`obj.emit(name, batch=b)`: each listener, vs a hand-written loop calling it",
            lambda t: _x(_slope(t, "hookwrap emit") / _slope(t, "hand emit loop"))),
        row("`obj.emit(name, batch=b)` with no listener, vs that loop's call",
            lambda t: f"{_x(t['hookwrap emit k=0'] / t['hand emit loop k=0'])} ({ns(t['hookwrap emit k=0'], t)})"),
        row("a `with obj.before(...)` block around one call, then a call of another object",
            lambda t: ns(t["scoped registration cycle"], t)),
        row("for reference: `functools.wraps` closure", lambda t: _x(t["functools.wraps closure"])),
        row("for reference: `@wrapt.decorator` pass-through", lambda t: _x(t["wrapt.decorator pass-through"])),
        row("for reference: hand-written loop over 0 callbacks", lambda t: _x(t["hand loop k=0"])),
    ]
    return _table(["ratio to a bare method call, or time"] + list(twins), rows)


SYSTEMS = [("pluggy (a hook, k plugins)", "pluggy"),
           ("blinker (a signal, k receivers)", "blinker"),
           ("`nn.Module` forward pre-hooks, `module(batch)`", "nn.Module pre-hooks"),
           ("hookwrap on the same module's `forward`, `module(batch)`", "hookwrap nn.Module forward pre")]


def others_table(run: dict[str, Any]) -> str:
    data = run["twins"]["compiled"]
    t = data["ratios"]
    unit, hand = t["unit"], _slope(t, "hand loop")
    rows = [["hookwrap, instance tier (`obj.before(\"step\", f)`)", _ns(t["hookwrap pre k=0"] * unit),
             _ns(_slope(t, "hookwrap pre") * unit), _x(_slope(t, "hookwrap pre") / hand)]]
    for label, system in SYSTEMS:
        if system in data["absent"]:
            rows.append([label, f"not measured: {data['absent'][system]}", "", ""])
            continue
        slope = _slope(t, system)
        rows.append([label, _ns(t[f"{system} k=0"] * unit), _ns(slope * unit), _x(slope / hand)])
    return _table(["compiled dispatch", "nothing registered", "each callback",
                   "each callback, vs a hand-written loop's"], rows)


def step_table(run: dict[str, Any]) -> str:
    steps = {TWINS[twin]: data["step"] for twin, data in run["twins"].items() if "step" in data}
    if not steps:
        return "(this run measured no training step: `tools/perf_run.py` without `--no-step`)\n"

    def row(label: str, f: Any) -> list[str]:
        return [label] + [f(s) for s in steps.values()]

    rows = [
        row("a training step, no callbacks", lambda s: f"{s['step'] * 1e6:,.0f} us"),
        row("hook overhead per step (same loop, no-op bodies: hooked - plain)",
            lambda s: f"{s['overhead'] * 1e6:.2f} us = {s['share']:.2%}"),
        row("of it hookwrap's own, beyond calling the 16 callbacks by hand",
            lambda s: f"{s['own'] * 1e6:.2f} us = {s['own_share']:.2%}"),
        row("a direct A/B of two real steps (within the timing noise)", lambda s: f"{s['ab_share']:+.1%}"),
    ]
    return _table([""] + list(steps), rows)


def instructions_table(counts: dict[str, Any]) -> str:
    per_call = {row["scenario"]: row["instructions"] for row in counts["rows"]}
    rows = []
    for row in counts["rows"]:
        if row["baseline"] is None:
            continue
        base = per_call[row["baseline"]]
        rows.append([row["scenario"], f"{row['instructions']:,.0f}", f"{base:,.0f} ({row['baseline']})",
                     _x(row["instructions"] / base)])
    n1, n2 = counts["calls"]
    head = (f"{'Compiled dispatch' if counts['dispatch'] == 'compiled' else 'Pure Python twin'}, "
            f"Python {counts['python']}; per call, from {n2:,} calls less {n1:,}, the calling loop included:\n\n")
    return head + _table(["scenario", "hookwrap", "by hand", "ratio"], rows)


def callbacks_table(costs: dict[str, Any]) -> str:
    """Each shipped callback's host reads and instructions per step (tools/callback_costs.py)."""
    counts = costs["instructions"]
    base = counts["none"]
    rows = []
    for name, reads in costs["host_reads"].items():
        cost = counts[name] - base
        hand = counts.get(f"hand:{name}")
        by_hand = "" if hand is None else f"{hand - base:+,.0f}"
        adds = "" if hand is None else f"{cost - (hand - base):+,.0f}"
        rows.append([f"`{name}`", f"{reads:.2f}", f"{cost:+,.0f}", by_hand, adds])
    n1, n2 = costs["steps"]
    head = (f"{'Compiled dispatch' if costs['dispatch'] == 'compiled' else 'Pure Python twin'}, "
            f"Python {costs['python']}; the loop: {costs['loop']}, {base:,.0f} instructions a step, "
            f"{costs['steps_per_epoch']} steps an epoch; per step, from {n2:,} steps less {n1:,}:\n\n")
    return head + _table(["callback", "host reads", "instructions", "the same by hand", "hookwrap adds"], rows)


def frameworks_table(costs: dict[str, Any]) -> str:
    """Per training step: each framework alone, with K no-op callbacks of its own
    system, and with hookwrap's preset and K no-op hw.Callbacks on the same hook
    points (tools/framework_costs.py)."""
    rows = []
    for framework, counts in costs["instructions"].items():
        label, native = FRAMEWORK_NAMES[framework]
        base = counts["none"]
        points = len(costs["hooks"][framework][0])

        def added(key: str) -> str:
            return f"{counts[key] - base:+,.0f}" if key in counts else "not measured"

        alone = costs["samples"][framework]["none"]
        rows.append([f"{label}: {base:,.0f} a step alone ({min(alone):,.0f} to {max(alone):,.0f})",
                     f"{native} ({points} hook points)", "", added("native 1"), added("native 8")])
        for variant, twin in (("preset", "compiled"), ("preset-pure", "pure Python twin")):
            rows.append(["", f"hookwrap preset and `hw.Callback`s, {twin}", added(f"{variant} 0"),
                         added(f"{variant} 1"), added(f"{variant} 8")])
    warmup, steps = costs["window"]
    head = (f"Python {costs['python']}; the model: {costs['loop']}; instructions added a step, counted "
            f"over {steps} steps after {warmup}, each the median of {costs['layouts']} memory layouts; the "
            f"framework alone moves within the range given, and so does each figure:\n\n")
    return head + _table(["framework", "callbacks through", "0 callbacks", "1 callback", "8 callbacks"], rows)


def tables(run: dict[str, Any], instructions: dict[str, dict[str, Any]],
           costs: dict[str, Any] | None = None, frameworks: dict[str, Any] | None = None) -> dict[str, str]:
    """Marker name -> the markdown it holds."""
    out = {"about": about(run), "dispatch": dispatch_table(run), "others": others_table(run),
           "step": step_table(run)}
    for twin, counts in instructions.items():
        out[f"instructions-{twin}"] = instructions_table(counts)
    if costs is not None:
        out["callbacks"] = callbacks_table(costs)
    if frameworks is not None:
        out["frameworks"] = frameworks_table(frameworks)
    return out


def load() -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any] | None, dict[str, Any] | None]:
    """The committed run, counts, callback costs and framework costs."""
    run = json.loads(RUN.read_text(encoding="utf-8"))
    counts = {twin: json.loads(path.read_text(encoding="utf-8"))
              for twin, path in INSTRUCTIONS.items() if path.exists()}
    costs = json.loads(CALLBACK_COSTS.read_text(encoding="utf-8")) if CALLBACK_COSTS.exists() else None
    frameworks = json.loads(FRAMEWORK_COSTS.read_text(encoding="utf-8")) if FRAMEWORK_COSTS.exists() else None
    return run, counts, costs, frameworks


def render(page: str, generated: dict[str, str]) -> str:
    """The page with each marked block replaced by its table; every marker must have one."""
    seen = set()

    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in generated:
            raise SystemExit(f"perf_tables: no table for the marker {name!r}")
        seen.add(name)
        return match.group(1) + generated[name] + match.group(4)

    out = MARKER.sub(fill, page)
    if seen != set(generated):
        raise SystemExit(f"perf_tables: the page has no marker for {sorted(set(generated) - seen)}")
    return out


def main(argv: list[str]) -> int:
    if argv[:1] in (["--write"], ["--check"]) and len(argv) == 2:
        page = Path(argv[1])
        text = page.read_text(encoding="utf-8")
        new = render(text, tables(*load()))
        if argv[0] == "--check":
            if new != text:
                print(f"{page}: its tables differ from those of {RUN.relative_to(ROOT)}; "
                      f"run python tools/perf_tables.py --write {argv[1]}", file=sys.stderr)
                return 1
            return 0
        page.write_text(new, encoding="utf-8")
        return 0
    if not argv:
        for name, table in tables(*load()).items():
            print(f"<!-- {name} -->\n{table}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
