"""``hookwrap demo``: a real PyTorch run, extended without editing its loop.

A small MLP learns a synthetic classification task through the example trainer
(``examples/trainer.py``, installed as ``hookwrap.examples.trainer``), whose
``fit / epoch / step / loss / backward / optimizer_step / evaluate`` are join
points. Callbacks are added each way hookwrap offers: a class ``callbacks``
list, a ``post_*_callback`` method, ``@trainer.before("loss")``, ``Callback``
objects (hookwrap.torch's shipped ones) and a global ``with`` block. Then the
report gives the cost per step measured in this run: hookwrap's own (the trainer's
step with its callbacks through hookwrap, against the same step with the same
callbacks written by hand, interleaved, compared by a statistic that load on the
machine does not move: ``hookwrap._bench.paired``), apart from the callbacks' own
work, next to that work written by hand; last, a Profiler attached for a few steps
writes a trace in which the loop's stages appear by name.
"""

from __future__ import annotations

import collections
import inspect
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, TextIO

from . import USING_EXTENSION
from ._bench.paired import Estimate, block_minima, interleaved, paired
from ._callback import boundary
from ._describe import describe

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


PER_STEP_EVENTS = ("step", "loss", "backward", "optimizer_step")
# The timing (~0.5 s): TURNS turns of the hooked step and the same step with the
# callbacks called by hand, each once per turn in a shuffled order, for hookwrap's
# own cost; WORK_TURNS turns of the hand-written one and the step without the
# callbacks, for their work. Two variants at a time: with a third between them, a
# variant more often finds its code and data evicted, which a loop of one variant
# never does. Compared as min-of-blocks of BLOCK turns (paired.block_minima).
TURNS, WORK_TURNS, BLOCK = 400, 150, 10

# The example trainer's step (examples/trainer.py) as a user writes it without
# hookwrap: plain functions calling the callbacks by hand, where hookwrap would.
# Each {event} placeholder becomes that event's calls, generated from the trainer's
# own chain (hand_written_steps); loss, backward and optimizer_step call the
# example's own bodies. Kept in step with ExampleTrainer.step (a test checks it).
_HAND_STEP = """
def step(batch):
{pre_step}
    inputs, targets = (t.to(self.device, non_blocking=True) for t in batch)
    logits = self.model(inputs)
    loss_ = loss(logits, targets)
    backward(loss_)
    optimizer_step()
    self.steps += 1
    return_value = loss_.detach()
{post_step}
    return return_value
"""


def _calls(entries: list[tuple[str, Any, list[str]]], phase: str, first: int) -> list[str]:
    """Source lines calling ``entries`` of ``phase`` by hand (callables c<first>...),
    as the contract asks: a pre- callback naming an argument returns it, a post-
    callback naming ``return_value`` returns it."""
    lines = []
    for i, (entry_phase, _, names) in enumerate(entries, first):
        if entry_phase != phase:
            continue
        call = f"c{i}(self{''.join(', ' + n for n in names)})"
        if phase == "pre" and len(names) == 1:
            lines.append(f"    {names[0]} = {call}")
        elif phase == "post" and "return_value" in names:
            lines.append(f"    return_value = {call}")
        else:
            lines.append(f"    {call}")
    return lines or ["    pass"]


def _hand_calls(trainer: Any, event: str, spec: Any) -> list[tuple[str, Any, list[str]]]:
    """``(phase, callable, names)`` of each callback the trainer runs on ``event``, in
    its order: the callable hookwrap plans for the join point (a shipped callback's
    reader) and the argument names it asks for. A ``rank_zero_only`` callback is
    called unconditionally: the demo runs one process."""
    from ._joinpoints import for_join_point

    calls = []
    for entry in describe(trainer).chains.get(event, []):
        gate = getattr(entry.options, "gate", None)
        if entry.phase not in ("pre", "post") or (
                gate is not None and (gate.every or gate.once or gate.when is not None)):
            raise ValueError(f"hand_written_steps: {entry.phase}-{event} with {gate!r}: "
                             f"not written by hand here")  # the demo's set has none
        fn = for_join_point(entry.fn, spec)
        names = list(inspect.signature(fn).parameters)[1:]
        if entry.phase == "pre" and len(names) > 1:
            raise ValueError(f"hand_written_steps: pre-{event} naming {names}: not written by hand here")
        calls.append((entry.phase, fn, names))
    return calls


def _step_source(trainer: Any, events: tuple[str, ...], with_calls: bool) -> tuple[str, list[Any]]:
    """The source of ``build(self, C, F)``, which returns the step written by hand,
    and the callables it calls (``C``)."""
    from ._joinpoints import spec_of, target_join_points

    jps = target_join_points(type(trainer))
    callables: list[Any] = []
    pieces = []
    for event in events:
        spec = spec_of(jps[event])
        calls = _hand_calls(trainer, event, spec) if with_calls else []
        pre, post = _calls(calls, "pre", len(callables)), _calls(calls, "post", len(callables))
        callables += [fn for _, fn, _ in calls]
        if event == "step":
            pieces.append(_HAND_STEP.format(pre_step="\n".join(pre), post_step="\n".join(post)))
            continue
        args = list(inspect.signature(spec.func).parameters)[1:]
        pieces.append("\n".join([f"def {event}({', '.join(args)}):", *pre,
                                  f"    return_value = _{event}(self{''.join(', ' + a for a in args)})",
                                  *post, "    return return_value"]))
    source = ("def build(self, C, F):\n"
              + "".join(f"    c{i} = C[{i}]\n" for i in range(len(callables)))
              + "".join(f"    _{e} = F[{e!r}]\n" for e in events if e != "step")
              + "".join(f"    {line}\n" for piece in pieces for line in piece.splitlines())
              + "    return step\n")
    return source, callables


def hand_written_steps(trainer: Any, events: tuple[str, ...] = PER_STEP_EVENTS
                       ) -> tuple[Callable[[Any], Any], Callable[[Any], Any], int]:
    """``(hand, plain, calls)``: the trainer's step written by hand, with no join
    point: ``hand`` calls the callbacks of ``events`` that the trainer runs now, in
    its order, with what each names (the same callables hookwrap calls, the shipped
    callbacks' readers included); ``plain`` is the same step without them. Both run
    on ``trainer`` itself (its model, optimizer and callbacks' state); ``calls`` is
    how many callbacks ``hand`` calls per step."""
    from ._joinpoints import spec_of, target_join_points

    jps = target_join_points(type(trainer))
    originals = {event: spec_of(jps[event]).func for event in events}
    made = []
    for with_calls in (True, False):
        source, callables = _step_source(trainer, events, with_calls)
        namespace: dict[str, Any] = {}
        label = "hand-written" if with_calls else "plain"
        exec(compile(source, f"<hookwrap demo: the {label} step>", "exec"), namespace)  # noqa: S102
        made.append((namespace["build"](trainer, callables, originals), len(callables)))
    (hand, calls), (plain, _) = made
    return hand, plain, calls


class StepCosts(NamedTuple):
    """What ``time_steps`` measured: median seconds per step of each variant, and the
    robust paired estimates of hookwrap's own cost and of the callbacks' work."""

    hooked_step: float  # the trainer's step with its callbacks, through hookwrap
    hand_step: float  # the same step with the same callbacks called by hand
    plain_step: float  # the same step without the callbacks
    own: Estimate  # hooked - hand: hookwrap's own cost per step
    work: Estimate  # hand - plain: the callbacks' work (written by hand)
    calls: int  # callbacks called per step
    pairs: int  # interleaved pairs of steps behind ``own``


def time_steps(trainer: Any, batches: list[Any], turns: int = TURNS, work_turns: int = WORK_TURNS,
               block: int = BLOCK) -> StepCosts:
    """Time the trainer's step through hookwrap with its callbacks against the same
    callbacks written by hand into the same loop (``hand_written_steps``): hookwrap's
    own cost; and the hand-written one against the loop without them: the callbacks'
    work. Interleaved on the same batches, two variants at a time
    (``paired.interleaved``), so what the machine does at a moment falls on both
    alike. Each estimate is the median, over blocks of ``block`` turns, of the
    difference of the two variants' fastest step in the block
    (``paired.block_minima``), with its distribution-free interval (``paired.paired``)."""
    hand, plain, calls = hand_written_steps(trainer)
    interleaved([trainer.step, hand, plain], batches, block)  # warm-up: every path run
    hooked_t, hand_t = interleaved([trainer.step, hand], batches, turns)
    by_hand, plain_t = interleaved([hand, plain], batches, work_turns, seed=1)
    return StepCosts(statistics.median(hooked_t), statistics.median(hand_t), statistics.median(plain_t),
                     own=paired(block_minima(hooked_t, hand_t, block)),
                     work=paired(block_minima(by_hand, plain_t, block)), calls=calls, pairs=turns)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:+.1f}"


def overhead_lines(costs: StepCosts, events: tuple[str, ...] = PER_STEP_EVENTS) -> list[str]:
    """The report's lines on the cost per step: hookwrap's own, then the callbacks'
    work next to the same work written by hand, and a note where the machine was
    too noisy to say."""
    own = costs.own
    level = math.floor(own.confidence * 100)
    lines = [
        f"hook overhead (hookwrap's own): {_us(own.value)} us a step = {own.value / costs.plain_step:+.1%} of "
        f"{costs.plain_step * 1e6:.0f} us ({level}% interval {_us(own.low)} to {_us(own.high)} us; "
        f"{costs.calls} callback calls vs. by hand)",
        f"callbacks' work (theirs): {_us(costs.work.value)} us a step written by hand, "
        f"{_us(costs.work.value + own.value)} us through hookwrap",
    ]
    if own.noisy:
        lines.append(f"note: the machine was too noisy to measure hookwrap's own cost this run "
                     f"({own.why_noisy()}); run it again when it is quieter"
                     + ("; or count instructions: tools/callgrind_step.sh" if shutil.which("valgrind") else ""))
    return lines


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

    # The cost per step: this trainer's step with its callbacks through hookwrap, the
    # same step with the same callbacks written by hand, and without them, interleaved
    # on the same collated batches; hookwrap's own cost is the first minus the second.
    # Steps called outside fit: their end is no boundary, so what the callbacks hold
    # from them is delivered at this block's end (rows, NaN checks), not at exit.
    with boundary():
        costs = time_steps(trainer, list(trainer.train_loader))
    per_step_events = PER_STEP_EVENTS
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
    for line in overhead_lines(costs):
        out(line)
    out(f"profile (Profiler, 3 steps after training): {trace}: "
        + ", ".join(f"{name} x{n}" for name, n in ranges.items()))
    out(f"dispatch: {dispatch_name()}")
    return {"steps": steps, "rates": rates, "trace": trace, "ranges": ranges, "epochs": epochs_run, "metrics": trainer.history[-1],
            "stopped": trainer.stop_reason, "hooked_step": costs.hooked_step,
            "hand_step": costs.hand_step, "plain_step": costs.plain_step,
            "overhead": costs.own.value, "share": costs.own.value / costs.plain_step, "costs": costs,
            "noisy": costs.own.noisy, "samples": seen, "best": best,
            "timer": timer, "log": log, "trainer": trainer}
