"""``hookwrap demo``: a real PyTorch run, extended without editing its loop.

A small MLP learns a synthetic classification task through the example trainer
(``examples/trainer.py``, installed as ``hookwrap.examples.trainer``), whose
``fit / epoch / step / loss / backward / optimizer_step / evaluate`` are join
points. Callbacks are added each way hookwrap offers: a class ``callbacks``
list, a ``post_*_callback`` method, ``@trainer.before("loss")``, ``Callback``
objects (hookwrap.torch's shipped ones) and a global ``with`` block. Then the
same steps run without any callback, and the report gives the hook overhead
measured in this run; last, a Profiler attached for a few steps writes a trace
in which the loop's stages appear by name.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from . import USING_EXTENSION
from ._describe import describe
from ._lifecycle import boundary

NEEDS = ("hookwrap demo needs PyTorch and tqdm: "
         "python -m pip install \"hookwrap[torch]\" torch==2.13.0")


def _announce(self: Any) -> None:
    # A class-tier callback from the `callbacks` list: every DemoTrainer runs it.
    self.out(f"training an MLP on {self.device.type}: {len(self.train_loader.dataset)} samples, "
             f"batches of {self.train_loader.batch_size}; dispatch: {dispatch_name()}")


def dispatch_name() -> str:
    return "compiled" if USING_EXTENSION else "pure Python"


def _demo_trainer_class() -> Any:
    from .examples.trainer import ExampleTrainer

    class DemoTrainer(ExampleTrainer):
        """The example trainer with class-tier callbacks: they run on every instance."""

        callbacks = [("pre-fit", _announce)]
        out: Callable[[str], Any] = print
        history: list[dict[str, float]]

        def post_evaluate_callback(self, return_value):  # type: ignore[no-untyped-def]
            self.history.append(dict(return_value))
            return return_value

    return DemoTrainer


def _timed_fit(trainer: Any, epochs: int) -> float:
    start = time.perf_counter()
    trainer.fit(epochs)
    return float((time.perf_counter() - start) / max(trainer.steps, 1))


def step_times(trainer: Any, batches: list[Any], rounds: int = 30,
               block: int = 10) -> tuple[float, float]:
    """Median seconds per ``step`` of one trainer with its own callbacks and with them
    detached, in alternating blocks on the same batches: same object, model and
    memory, and drift of a shared machine falls on both alike."""
    attached = list(trainer.callbacks)
    times: tuple[list[float], list[float]] = ([], [])
    clock = time.perf_counter
    try:
        for r in range(rounds):
            chunk = [batches[(r * block + i) % len(batches)] for i in range(block)]
            for entries, out in ((attached, times[0]), ([], times[1])):
                trainer.callbacks[:] = entries
                for batch in chunk:
                    start = clock()
                    trainer.step(batch)
                    out.append(clock() - start)
    finally:
        trainer.callbacks[:] = attached
    return statistics.median(times[0]), statistics.median(times[1])


def callback_set(workdir: Path, device: str = "cpu", total: int | None = None,
                 stream: TextIO | None = None) -> tuple[list[Any], Any]:
    """The demo's shipped callbacks, at their defaults but for the settings shown:
    ``(NanGuard, EarlyStopping, BestCheckpoint, StepTimer, GradNorm, LRMonitor,
    Throughput, MetricsLogger)`` for the trainer, and the ProgressBar (used on the
    global tier)."""
    from .torch import (BestCheckpoint, EarlyStopping, GradNorm, LRMonitor, MetricsLogger, NanGuard,
                        ProgressBar, StepTimer, Throughput)

    log = MetricsLogger(workdir / "metrics.csv", every=10, tensorboard=False)  # loss every 10 steps
    callbacks = [NanGuard(), EarlyStopping("val_loss", patience=3, min_delta=0.002),
                 BestCheckpoint(workdir / "best.pt", monitor="val_loss", restore_best=True),
                 StepTimer(device),
                 GradNorm(every=50, logger=log),  # a norm costs ~100 us: not every step
                 LRMonitor(logger=log), Throughput(every=50, logger=log), log]
    return callbacks, ProgressBar(total=total, file=stream or sys.stderr)


def profile_steps(trainer: Any, batches: list[Any], folder: Path,
                  events: tuple[str, ...]) -> tuple[Path, dict[str, int]]:
    """Profile 3 steps of ``trainer`` (after one warm-up step) with a Profiler
    attached for them: its trace, and how many ranges of each join point it holds."""
    from .torch import Profiler

    profiler = Profiler(events=events, dir=folder, wait=0, warmup=1, active=3)
    with trainer.add_callback(profiler):
        for batch in batches[:4]:  # the trace is written after the 4th
            trainer.step(batch)
    trace = Path(profiler.traces[0])
    with open(trace, encoding="utf-8") as f:
        names = [e.get("name", "") for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation"]
    counted = collections.Counter(n for n in names if n.startswith("hookwrap:"))
    return trace, {f"hookwrap:{event}": counted[f"hookwrap:{event}"] for event in events}


def run(epochs: int = 20, device: str = "cpu", hooks: bool = True, out: Callable[[str], Any] = print,
        stream: TextIO | None = None, workdir: str | None = None) -> dict[str, Any]:
    """Train; print the report through ``out`` (the progress bar goes to ``stream``,
    stderr by default). Returns the numbers of the report."""
    import torch

    from .examples.trainer import ExampleTrainer, make_run

    torch.set_num_threads(1)  # a small model: more threads add jitter to the timings, not speed
    make_run(device).fit(1)  # warm-up (allocator, kernels), so the timed runs compare fairly
    if not hooks:
        plain = make_run(device, trainer_class=ExampleTrainer)
        per_step = _timed_fit(plain, epochs)
        out(f"trained {epochs} epochs, {plain.steps} steps on {device} without callbacks")
        out("final metrics: " + ", ".join(f"{k} {v:.4f}" for k, v in (plain.metrics or {}).items()))
        out(f"time per step: {per_step * 1e6:.0f} us; no hooks, so no hook overhead; "
            f"dispatch: {dispatch_name()}")
        return {"steps": plain.steps, "metrics": plain.metrics, "per_step": per_step}

    tmp = Path(workdir or tempfile.mkdtemp(prefix="hookwrap-demo-"))
    trainer: Any = make_run(device, trainer_class=_demo_trainer_class())
    trainer.out, trainer.history = out, []
    samples = {"seen": 0}

    @trainer.before("loss")  # instance tier: this trainer only; takes targets, so returns them
    def count_samples(self: Any, targets: Any) -> Any:
        samples["seen"] += len(targets)
        return targets

    callbacks, bar = callback_set(tmp, device, total=len(trainer.train_loader), stream=stream)
    for callback in callbacks:
        trainer.add_callback(callback)
    _, _, best, timer, grad_norm, _, throughput, log = callbacks

    with bar:  # global tier, for this block: every hookable trainer with these events
        trainer.fit(epochs)
    epochs_run = len(trainer.history)
    rates = throughput.last or {}  # of training (the timing below runs its steps detached in turns)

    stopped = trainer.stop_reason or "no (ran every epoch)"
    rows, steps, seen = len(log.read()), trainer.steps, samples["seen"]

    # Per-step hook overhead: this trainer with its callbacks, against itself with
    # them detached, alternating on the same collated batches.
    # Steps called outside fit: their end is no boundary, so what the callbacks hold
    # from them is delivered at this block's end (rows, NaN checks), not at exit.
    with boundary():
        hooked_step, plain_step = step_times(trainer, list(trainer.train_loader))
    overhead = hooked_step - plain_step
    share = overhead / plain_step
    noise = " (within timing noise)" if abs(share) < 0.01 else ""
    per_step_events = ("step", "loss", "backward", "optimizer_step")
    callbacks_per_step = sum(len(chain) for event, chain in describe(trainer).chains.items()
                             if event in per_step_events)
    with boundary():
        trace, ranges = profile_steps(trainer, list(trainer.train_loader), tmp / "profile", per_step_events)
    out(f"trained {epochs_run} of {epochs} epochs, {steps} steps, {seen} samples; "
        f"stopped early: {stopped}")
    out("final metrics: " + ", ".join(f"{k} {v:.4f}" for k, v in trainer.history[-1].items())
        + f"; best val_loss {best.best.value:.4f} at step {best.best_step}, restored from {best.path.name}")
    out(f"step time (StepTimer): median {timer.median() * 1e6:.0f} us; grad norm {grad_norm.last:.3f}; "
        f"metrics log: {rows} rows in {log.path}")
    out(f"throughput (Throughput, last 50 steps): {rates.get('samples_per_sec', 0):,.0f} samples/s, "
        f"{rates.get('steps_per_sec', 0):,.0f} steps/s")
    out(f"hook overhead: {overhead * 1e6:+.1f} us per step = {share:+.1%} of step time{noise}: "
        f"median step {hooked_step * 1e6:.0f} us with the {callbacks_per_step} callbacks of "
        f"{'/'.join(per_step_events)}, {plain_step * 1e6:.0f} us with them detached "
        f"(their own work included; 300 steps each, alternating, this run)")
    out(f"profile (Profiler, 3 steps after training): {trace}: "
        + ", ".join(f"{name} x{n}" for name, n in ranges.items()))
    out(f"dispatch: {dispatch_name()}")
    return {"steps": steps, "rates": rates, "trace": trace, "ranges": ranges, "epochs": epochs_run, "metrics": trainer.history[-1],
            "stopped": trainer.stop_reason, "hooked_step": hooked_step,
            "plain_step": plain_step,
            "overhead": overhead, "share": share, "samples": seen, "best": best,
            "timer": timer, "log": log, "trainer": trainer}
