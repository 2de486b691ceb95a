"""The performance page's tables are what tools/perf_tables.py makes of the
committed benchmark run (docs/performance/*.json): a hand edit fails here."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("perf_tables", ROOT / "tools" / "perf_tables.py")
assert _spec is not None and _spec.loader is not None
perf_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(perf_tables)

PAGE = ROOT / "docs" / "performance.md"


def _blocks(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in perf_tables.MARKER.finditer(text)}


def test_the_page_holds_the_tables_the_script_makes_of_the_committed_run():
    page = PAGE.read_text(encoding="utf-8")
    generated = perf_tables.tables(*perf_tables.load())
    assert set(generated) == {"about", "dispatch", "others", "step", "instructions-compiled",
                              "instructions-pure", "callbacks", "frameworks"}
    assert _blocks(page) == generated
    assert perf_tables.render(page, generated) == page


def test_the_tables_come_from_the_run():
    run, counts, *_ = perf_tables.load()
    compiled = run["twins"]["compiled"]["ratios"]
    dispatch = perf_tables.dispatch_table(run)
    # The method row is the run's own ratio, as hookwrap bench computes it.
    assert f"| nothing registered: method | {compiled['hookwrap pre k=0']:.2f}x |" in dispatch
    bare = f"{compiled['unit'] * 1e9:,.0f} ns"
    assert f"| a bare `obj.step(batch)` call: the unit | {bare} |" in dispatch
    row = next(row for row in counts["compiled"]["rows"] if row["scenario"] == "hookwrap k=0")
    assert f"| {row['scenario']} | {row['instructions']:,.0f} |" in perf_tables.instructions_table(counts["compiled"])


def test_a_hand_edit_of_a_table_is_caught(tmp_path):
    page = PAGE.read_text(encoding="utf-8")
    block = _blocks(page)["dispatch"]
    # One ratio, made better by hand.
    edited = page.replace(block, re.sub(r"(\d+\.\d\d)x", lambda m: f"{float(m[1]) - 0.01:.2f}x", block, count=1))
    assert edited != page
    copy = tmp_path / "performance.md"
    copy.write_text(edited, encoding="utf-8")
    assert perf_tables.main(["--check", str(copy)]) == 1
    assert perf_tables.main(["--write", str(copy)]) == 0
    assert copy.read_text(encoding="utf-8") == page
    assert perf_tables.main(["--check", str(copy)]) == 0


def test_a_marker_without_a_table_or_a_table_without_a_marker_is_refused():
    generated = perf_tables.tables(*perf_tables.load())
    page = PAGE.read_text(encoding="utf-8")
    with pytest.raises(SystemExit, match="no table for the marker 'nope'"):
        perf_tables.render(page + "<!-- perf-tables:begin nope -->\n<!-- perf-tables:end nope -->\n", generated)
    without_step = re.sub(r"<!-- perf-tables:begin step -->.*?<!-- perf-tables:end step -->", "", page, flags=re.S)
    with pytest.raises(SystemExit, match="no marker for \\['step'\\]"):
        perf_tables.render(without_step, generated)


def test_the_committed_run_is_small_and_names_its_machine():
    path = ROOT / "docs" / "performance" / "run.json"
    assert path.stat().st_size < 100_000
    run = json.loads(path.read_text(encoding="utf-8"))
    assert set(run["twins"]) == {"compiled", "pure"}
    assert run["machine"]["python"] and run["commit"]["id"]


def test_the_callback_table_comes_from_the_committed_costs():
    _, _, costs, _ = perf_tables.load()
    assert costs is not None
    table = perf_tables.callbacks_table(costs)
    base = costs["instructions"]["none"]
    clip = costs["instructions"]["GradClip"] - base
    hand = costs["instructions"]["hand:GradClip"] - base
    assert f"| `GradClip` | 0.00 | {clip:+,.0f} | {hand:+,.0f} | {clip - hand:+,.0f} |" in table
    assert set(costs["host_reads"]) == {row.split("`")[1] for row in table.splitlines() if row.startswith("| `")}


def test_the_framework_table_is_the_committed_count():
    *_, frameworks = perf_tables.load()
    table = perf_tables.frameworks_table(frameworks)
    for framework, counts in frameworks["instructions"].items():
        alone = counts["none"]
        assert f"{alone:,.0f} a step alone" in table
        for key in ("native 1", "preset 0", "preset 1", "preset-pure 0"):
            assert f"{counts[key] - alone:+,.0f}" in table  # each figure is the run's, less the framework alone
        samples = frameworks["samples"][framework]
        assert all(len(got) == frameworks["layouts"] for got in samples.values())
        assert counts["none"] == sorted(samples["none"])[len(samples["none"]) // 2]  # the median kept
