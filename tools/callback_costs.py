"""What each shipped callback of ``hookwrap.torch`` costs per training step: host
reads (``count_host_reads``) and instructions (callgrind), on a tiny CPU loop.

    python tools/callback_costs.py [--only NAME,NAME] [--json PATH] [--no-callgrind]

(``--json docs/performance/callback-costs.json``, then ``tools/perf_tables.py
--write docs/performance.md``, for the performance page's table.)

The loop has the example trainer's join points (``fit``, ``epoch``, ``step``,
``loss``, ``backward``, ``optimizer_step``, ``evaluate``) around a
``Linear(32, 8)`` on SGD, 50 steps an epoch and an evaluation after each, so a
callback acting per epoch is counted per step, amortised. Host reads are counted
over 200 steps in this process. Instructions: each loop runs in its own process
under ``valgrind --tool=callgrind`` for N1 and N2 steps (after warm-up steps that
cover a Profiler's window); the difference per step cancels imports and start-up,
and the callback's cost is its loop's count minus the loop without callbacks.
torch's own work varies by some hundreds of instructions a step from process to
process: read small differences as zero. Where the loop can be written by hand
(``hand:...``: the same work in the step, no hookwrap), it is counted too, so the
difference is what hookwrap adds. A developer harness: not part of the package.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

N1, N2 = 100, 600
WARMUP = 30  # steps before counting: past a Profiler's default window (1 + 1 + 3)
STEPS_PER_EPOCH = 50
READ_STEPS = 200
TIME_LIMIT_S = 24 * 3600.0  # TimeLimit's budget: never spent here, checked every step


def make_trainer(hand: str = "") -> Any:
    """The tiny loop; ``hand`` names a callback's work written into it by hand."""
    import torch

    import hookwrap as hw

    class Tiny(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            gen = torch.Generator().manual_seed(0)
            self.model = torch.nn.Linear(32, 8)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
            self.batches = [(torch.randn(16, 32, generator=gen), torch.randint(0, 8, (16,), generator=gen))
                            for _ in range(STEPS_PER_EPOCH)]
            self.ema = [p.detach().clone() for p in self.model.parameters()]
            self.steps = 0
            self.stop_reason: str | None = None
            self.scaler = torch.amp.GradScaler("cpu") if hand == "GradScaler" else None
            self.started = time.monotonic()

        @hw.hookable
        def fit(self, steps: int) -> None:
            try:
                while self.steps < steps:
                    self.epoch(steps)
                    self.evaluate()
            except hw.StopTraining as stop:
                self.stop_reason = str(stop)

        @hw.hookable
        def epoch(self, steps: int) -> None:
            for batch in self.batches:
                if self.steps == steps:
                    return
                self.step(batch)

        @hw.hookable
        def step(self, batch: Any) -> Any:
            self.steps += 1
            inputs, targets = batch
            if hand == "Autocast":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = self.loss(self.model(inputs), targets)
            else:
                loss = self.loss(self.model(inputs), targets)
            self.backward(loss if self.scaler is None else self.scaler.scale(loss))
            if hand == "GradClip":
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer_step()
            if hand == "EMA":
                with torch.no_grad():
                    torch._foreach_lerp_(self.ema, [p.detach() for p in self.model.parameters()], 1 - 0.999)
            if hand == "TimeLimit" and time.monotonic() - self.started >= TIME_LIMIT_S:
                raise hw.StopTraining("time limit reached")
            return loss.detach()

        @hw.hookable
        def loss(self, logits: Any, targets: Any) -> Any:
            return torch.nn.functional.cross_entropy(logits, targets)

        @hw.hookable
        def backward(self, loss: Any) -> None:
            loss.backward()

        @hw.hookable
        def optimizer_step(self) -> None:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad()

        @hw.hookable
        def evaluate(self) -> dict[str, float]:
            return {"val_loss": 1.0 / self.steps}  # improving: no early stop

    return Tiny()


def callbacks(workdir: Path) -> dict[str, Callable[[], Any]]:
    """Each shipped callback at its defaults, but for what the loop needs."""
    import hookwrap.torch as ht

    made: dict[str, Callable[[], Any]] = {
        "NanGuard": lambda: ht.NanGuard(),
        "EarlyStopping": lambda: ht.EarlyStopping("val_loss", patience=3),
        "BestCheckpoint": lambda: ht.BestCheckpoint(workdir / "best.pt", monitor="val_loss"),
        "StepTimer": lambda: ht.StepTimer(),
        "GradNorm": lambda: ht.GradNorm(),
        "LRMonitor": lambda: ht.LRMonitor(),
        "MetricsLogger": lambda: ht.MetricsLogger(workdir / "metrics.csv", tensorboard=False),
        "GradClip": lambda: ht.GradClip(1.0),
        "GradAccumulation": lambda: ht.GradAccumulation(2),
        "EMA": lambda: ht.EMA(0.999),
        "Autocast": lambda: ht.Autocast(("step",), device_type="cpu"),
        "Profiler": lambda: ht.Profiler(dir=workdir / "profile"),
        "Throughput": lambda: ht.Throughput(),
        "MemoryMonitor": lambda: ht.MemoryMonitor(),
        "GradScaler": lambda: ht.GradScaler("cpu"),  # float32 here: the scaling's own work
        "SpikeDetection": lambda: ht.SpikeDetection(),
        "TimeLimit": lambda: ht.TimeLimit(TIME_LIMIT_S),
    }
    return made


HANDS = ("GradClip", "EMA", "Autocast", "GradScaler", "TimeLimit")  # a hand-written twin exists: "hand:<name>"


def run(variant: str, steps: int) -> Any:
    """Run the loop of ``variant`` (``none``, a callback's name, or ``hand:<name>``)
    for WARMUP + ``steps`` steps; returns the trainer."""
    workdir = Path(tempfile.mkdtemp(prefix="hookwrap-costs-"))
    try:
        hand = variant.removeprefix("hand:") if variant.startswith("hand:") else ""
        trainer = make_trainer(hand)
        made = callbacks(workdir)  # every variant imports the same modules (hookwrap.torch)
        if variant != "none" and not hand:
            trainer.add_callback(made[variant]())
        trainer.fit(WARMUP + steps)
        return trainer
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def host_reads(variant: str) -> float:
    """Host reads per step, over READ_STEPS steps after the warm-up."""
    from hookwrap.torch import count_host_reads

    workdir = Path(tempfile.mkdtemp(prefix="hookwrap-costs-"))
    try:
        trainer = make_trainer()
        trainer.add_callback(callbacks(workdir)[variant]())
        trainer.fit(WARMUP)
        with count_host_reads() as reads:
            trainer.fit(WARMUP + READ_STEPS)
        return reads.count / READ_STEPS
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def instructions(variant: str, steps: int) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--run", variant, str(steps)],
        capture_output=True, text=True, env=env, check=False)
    for line in out.stderr.splitlines():
        if "Collected" in line:
            return int(line.split()[-1])
    raise SystemExit(f"callback_costs: no callgrind count for {variant}:\n{out.stderr[-2000:]}")


def per_step(variant: str) -> float:
    return (instructions(variant, N2) - instructions(variant, N1)) / (N2 - N1)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs=2, metavar=("VARIANT", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument("--only", help="comma-separated callback names")
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--no-callgrind", action="store_true", help="host reads only")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.run:
        run(args.run[0], int(args.run[1]))
        return
    names = list(callbacks(Path(".")))
    if args.only:
        unknown = set(args.only.split(",")) - set(names)
        if unknown:
            parser.error(f"unknown callbacks {sorted(unknown)}; known: {', '.join(names)}")
        names = [n for n in names if n in args.only.split(",")]
    reads = {name: host_reads(name) for name in names}
    counts: dict[str, float] = {}
    if not args.no_callgrind:
        if shutil.which("valgrind") is None:
            raise SystemExit("callback_costs: valgrind is not installed (or pass --no-callgrind)")
        variants = ["none"] + names + [f"hand:{n}" for n in names if n in HANDS]
        with ThreadPoolExecutor(max_workers=2) as pool:
            counts = dict(zip(variants, pool.map(per_step, variants)))
    print(f"per step of a Linear(32, 8) SGD loop on the CPU, {STEPS_PER_EPOCH} steps an epoch "
          f"(compiled dispatch: {__import__('hookwrap').USING_EXTENSION})")
    if counts:
        print(f"the loop alone: {counts['none']:,.0f} instructions a step")
    print(f"{'callback':<18}{'host reads':>11}{'instructions':>14}{'by hand':>10}{'hookwrap adds':>15}")
    for name in names:
        row = f"{name:<18}{reads[name]:>11.2f}"
        if counts:
            cost = counts[name] - counts["none"]
            row += f"{cost:>+14,.0f}"
            if f"hand:{name}" in counts:
                hand = counts[f"hand:{name}"] - counts["none"]
                row += f"{hand:>+10,.0f}{cost - hand:>+15,.0f}"
        print(row)
    if args.json:  # what tools/perf_tables.py makes the performance page's table of
        meta = {"dispatch": "compiled" if __import__("hookwrap").USING_EXTENSION else "pure",
                "python": sys.version.split()[0], "steps": [N1, N2], "steps_per_epoch": STEPS_PER_EPOCH,
                "loop": "Linear(32, 8), SGD, batches of 16, on the CPU"}
        Path(args.json).write_text(json.dumps({**meta, "host_reads": reads, "instructions": counts}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
