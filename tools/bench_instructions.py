"""Instructions per call of each dispatch scenario, counted with callgrind.

Timed ratios on a shared machine move by 10% from run to run; instruction counts
do not. Each scenario runs in its own process under ``valgrind --tool=callgrind``
twice, for N1 and N2 calls; the difference per call cancels start-up and imports
(a fixed PYTHONHASHSEED keeps start-up identical). Every hookwrap scenario has a
hand-written twin calling the same callables, so a ratio compares only what
hookwrap adds. Run ``python tools/bench_instructions.py`` from a checkout with
hookwrap installed (``--pure`` for the pure twin; ``--sweep`` for k = 0, 1, 4, 8
callbacks of the class and instance tiers beside the hand loop; ``--json PATH`` also writes the
counts for ``tools/perf_tables.py``); it needs valgrind and takes a few minutes.
A developer harness: it is not part of the installed package.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from typing import Any

N1, N2 = 2_000, 22_000


def setup(name: str) -> tuple[str, dict[str, Any]]:
    """The statement making one call of scenario ``name``, and its namespace."""
    import hookwrap as hw

    from hookwrap._bench import _around, _listen, _pre, _pre_free, model_class
    from hookwrap._joinpoints import reader

    Model = model_class(hw)

    Declared = type("Declared", (Model,), {"callbacks": [("pre-step", _pre)]})

    class GlobalPre(hw.Callback):
        def pre_step(self, trainer: Any, batch: Any) -> Any:
            return batch

    fns: tuple[Any, ...] = ()

    def free_bare(batch: Any) -> Any:
        return batch

    def hand_free_loop(batch: Any) -> Any:
        for f in fns:
            batch = f(batch)
        return batch

    @hw.hookable
    def free(batch: Any) -> Any:
        return batch

    def wrapper(self: Any, batch: Any) -> Any:  # a hand-written around
        return Model.bare(self, batch)

    class ThirdParty:  # not written for hookwrap: woven below, as hw.weave does to a trainer
        def training_step(self, batch: Any) -> Any:
            return batch

    batch = [1, 2, 3]
    obj = Model()
    method = ("obj.step(batch)", {"obj": obj, "batch": batch})
    if name == "bare method":
        return "obj.bare(batch)", {"obj": obj, "batch": batch}
    if name == "bare function":
        return "fn(batch)", {"fn": free_bare, "batch": batch}
    if name == "bare classmethod":
        return "cls.bare_build(batch)", {"cls": Model, "batch": batch}
    if name == "hand loop k=1":
        obj.fns = (_pre,)
        return "obj.hand_loop(batch)", {"obj": obj, "batch": batch}
    if name == "hand loop of a bound method k=1":
        obj.fns = (GlobalPre().pre_step,)
        return "obj.hand_loop(batch)", {"obj": obj, "batch": batch}
    if name == "hand function loop k=1":
        fns = (_pre_free,)
        return "fn(batch)", {"fn": hand_free_loop, "batch": batch}
    if name == "hand wrap k=1":
        return "fn(obj, batch)", {"fn": wrapper, "obj": obj, "batch": batch}
    if name == "hand emit loop k=1":
        obj.fns = (_listen,)
        return "obj.hand_emit(batch)", {"obj": obj, "batch": batch}
    if name == "bare method reading two attributes":
        obj.first, obj.second = 1, 2
        return "obj.read_two()", {"obj": obj}
    if name == "the same, its object holding callbacks":
        obj.first, obj.second = 1, 2
        obj.before("step", _pre)
        obj.step(batch)
        return "obj.read_two()", {"obj": obj}
    if name == "hookwrap k=0":
        return method
    if name == "hookwrap k=0, a sibling has callbacks":
        Model().before("step", _pre)
        return method
    if name == "hookwrap k=0, a subclass of a hookable class":
        Model().step(batch)  # the join point last ran for the base class
        return "obj.step(batch)", {"obj": type("Sub", (Model,), {})(), "batch": batch}
    if name == "hookwrap function k=0":
        return "fn(batch)", {"fn": free, "batch": batch}
    if name == "hookwrap classmethod k=0":
        return "cls.build(batch)", {"cls": Model, "batch": batch}
    if name == "hookwrap class tier (declared list) k=1":
        return "obj.step(batch)", {"obj": Declared(), "batch": batch}
    if name == "hookwrap class tier (hw.before(Cls)) k=1":
        hw.before(Model, "step", _pre)
        return method
    if name == "hookwrap class tier, a shipped callback's reader k=1":
        hw.before(Model, "step", reader(GlobalPre().pre_step, "pre-", "batch"))
        return method
    if name == "hookwrap instance tier k=1":
        obj.before("step", _pre)
        return method
    if name == "hookwrap function tier k=1":
        free.before(_pre_free)
        return "fn(batch)", {"fn": free, "batch": batch}
    if name == "hookwrap global tier k=1":
        hw.register_global_callback(GlobalPre())
        return method
    if name == "hookwrap around k=1":
        obj.around("step", _around)
        return method
    if name == "hookwrap around, class tier k=1":
        hw.around(Model, "step", _around)
        return method
    if name == "hookwrap emit k=1":
        obj.on("on_batch", _listen)
        return "obj.emit('on_batch', batch=batch)", {"obj": obj, "batch": batch}
    if name.startswith("sweep "):  # "sweep hand k=4", "sweep class tier k=4", "sweep instance tier k=0"
        k = int(name.rsplit("=", 1)[1])
        # k distinct callbacks (one code, so that check() knows them): as k users' functions
        pres = [types.FunctionType(_pre.__code__, _pre.__globals__, f"_pre{i}") for i in range(k)]
        if "hand" in name:  # written out at the call site, as a user would without hookwrap
            calls = "".join(f"f{i}(obj, batch); " for i in range(k))
            return f"{calls}obj.bare(batch)", {**{f"f{i}": f for i, f in enumerate(pres)}, "obj": obj, "batch": batch}
        for f in pres:
            if "class tier" in name:
                hw.before(Model, "step", f)
            else:
                obj.before("step", f)
        return method
    if name.startswith("woven third-party method"):
        hw.weave(ThirdParty, step="training_step")
        if "k=1" in name:
            hw.before(ThirdParty, "step", _pre)
        return "obj.training_step(batch)", {"obj": ThirdParty(), "batch": batch}
    raise KeyError(name)


# --sweep: the per-callback cost, k = 0, 1, 4, 8 callbacks of one tier beside the
# same functions called by hand before the bare method (the slope and the constant gap).
SWEEP = [("bare method", None), ("sweep hand k=0", None), ("sweep class tier k=0", "sweep hand k=0")] + [
    row for k in (1, 4, 8) for row in ((f"sweep hand k={k}", None), (f"sweep class tier k={k}", f"sweep hand k={k}"),
                                       (f"sweep instance tier k={k}", f"sweep hand k={k}"))]

# (scenario, what it is compared with)
ROWS = [
    ("bare method", None),
    ("bare function", None),
    ("bare classmethod", None),
    ("hookwrap k=0", "bare method"),
    ("hookwrap k=0, a sibling has callbacks", "bare method"),
    ("hookwrap k=0, a subclass of a hookable class", "bare method"),
    ("hookwrap function k=0", "bare function"),
    ("hookwrap classmethod k=0", "bare classmethod"),
    ("woven third-party method k=0", "bare method"),
    ("hand loop k=1", None),
    ("hookwrap class tier (declared list) k=1", "hand loop k=1"),
    ("hookwrap class tier (hw.before(Cls)) k=1", "hand loop k=1"),
    ("woven third-party method, class tier k=1", "hand loop k=1"),
    ("hookwrap instance tier k=1", "hand loop k=1"),
    ("hand loop of a bound method k=1", None),
    ("hookwrap global tier k=1", "hand loop of a bound method k=1"),
    ("hookwrap class tier, a shipped callback's reader k=1", "hand loop of a bound method k=1"),
    ("hand function loop k=1", None),
    ("hookwrap function tier k=1", "hand function loop k=1"),
    ("hand wrap k=1", None),
    ("hookwrap around, class tier k=1", "hand wrap k=1"),
    ("hookwrap around k=1", "hand wrap k=1"),
    ("hand emit loop k=1", None),
    ("hookwrap emit k=1", "hand emit loop k=1"),
    ("bare method reading two attributes", None),
    ("the same, its object holding callbacks", "bare method reading two attributes"),
]


def run(name: str, n: int) -> None:
    """Make ``n`` calls of scenario ``name`` (what callgrind counts)."""
    statement, namespace = setup(name)
    # A function, so that the loop reads its names as fast locals.
    loop = f"def loop({', '.join(namespace)}):\n    for _ in range({n}):\n        {statement}\n"
    scope: dict[str, Any] = {}
    exec(compile(loop, "<scenario>", "exec"), scope)  # noqa: S102 - our own statement
    scope["loop"](**namespace)


CALLBACKS = {"_pre", "_pre_free", "_around", "_listen", "pre_step", "wrapper"}


def check(name: str) -> None:
    """Make one call of scenario ``name`` and check it: the batch comes back (None
    from emit) and the callbacks it names ran, once each with k=1, never with k=0."""
    statement, namespace = setup(name)
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in CALLBACKS:
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        *first, last = statement.split("; ")  # the hand-written calls, then the call whose result counts
        for part in first:
            eval(part, namespace)  # noqa: S307 - our own statement
        result = eval(last, namespace)  # noqa: S307
    finally:
        sys.setprofile(None)
    expected = None if "emit" in name else (1, 2) if statement == "obj.read_two()" else [1, 2, 3]
    callbacks = re.search(r"k=(\d+)", name)
    ran = int(callbacks[1]) if callbacks else 0
    if result != expected or len(calls) != ran:
        raise AssertionError(f"{name}: returned {result!r} (expected {expected!r}), "
                             f"ran callbacks {calls} (expected {ran})")


def count(name: str, n: int, env: dict[str, str]) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, os.path.abspath(__file__), "--run", name, str(n)],
        capture_output=True, text=True, env=env, check=True)
    for line in out.stderr.splitlines():
        if "Collected" in line:
            return int(line.split()[-1])
    raise RuntimeError(f"callgrind printed no count for {name!r}:\n{out.stderr[-2000:]}")


def per_call_counts(pure: bool, rows: list[tuple[str, str | None]]) -> dict[str, float]:
    """Scenario -> instructions per call, each counted in processes of its own."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    if pure:
        env["HOOKWRAP_NO_EXTENSIONS"] = "1"
    jobs = [(name, n) for name, _ in rows for n in (N1, N2)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # counts ignore load
        counts = dict(zip(jobs, pool.map(lambda job: count(job[0], job[1], env), jobs)))
    return {name: (counts[name, N2] - counts[name, N1]) / (N2 - N1) for name, _ in rows}


def table(pure: bool, per_call: dict[str, float], rows: list[tuple[str, str | None]]) -> str:
    twin = "pure Python twin" if pure else "compiled"
    lines = [f"instructions per call ({twin}; callgrind, {N2} - {N1} calls, the loop included)", "",
             f"  {'scenario':<54}{'instructions':>13}  ratio"]
    for name, base in rows:
        ratio = f"{per_call[name] / per_call[base]:>6.2f}x {base}" if base else ""
        lines.append(f"  {name:<54}{per_call[name]:>13,.0f}  {ratio}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--run"]:
        run(argv[1], int(argv[2]))
        return 0
    if argv[:1] == ["--check"]:
        check(argv[1])
        return 0
    if shutil.which("valgrind") is None:
        print("tools/bench_instructions.py needs valgrind (apt install valgrind)", file=sys.stderr)
        return 2
    pure = "--pure" in argv
    rows = SWEEP if "--sweep" in argv else ROWS
    for name, _ in rows:  # each scenario does what it says before it is counted
        subprocess.run([sys.executable, os.path.abspath(__file__), "--check", name], check=True,
                       env=dict(os.environ, HOOKWRAP_NO_EXTENSIONS="1" if pure else ""))
    per_call = per_call_counts(pure, rows)
    print(table(pure, per_call, rows))
    if "--json" in argv:  # machine-readable, for tools/perf_tables.py (docs/performance.md)
        with open(argv[argv.index("--json") + 1], "w", encoding="utf-8") as f:
            json.dump({"dispatch": "pure" if pure else "compiled", "calls": [N1, N2],
                       "python": sys.version.split()[0],
                       "rows": [{"scenario": name, "instructions": round(per_call[name], 1), "baseline": base}
                                for name, base in rows]}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
