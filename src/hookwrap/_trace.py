"""``hookwrap trace SCRIPT [ARGS]``: run a script's first optimizer steps and say what
it calls per step (its own functions, the loss functions with gradients on and off,
``backward``, each optimizer's ``step``, gradient clipping, an evaluation under
``torch.no_grad()``), then print a ``hookwrap run`` command, ready to run, that logs
its loss, its evaluation and its updates.

The script runs as under ``hookwrap run`` (its argv, ``__main__``, ``--preset
torch_optim`` to count the steps), with ``sys.setprofile`` watching the calls, and
is stopped after ``--steps`` optimizer steps (or at its end, if sooner): what it
would print after that is not printed."""

from __future__ import annotations

import inspect
import os
import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import Any

__all__ = ["trace"]

PROG = "hookwrap trace"

# A loss of torch.nn.functional: what its name says (cross_entropy, nll_loss, mse_loss,
# binary_cross_entropy_with_logits, ...).
_LOSS_WORDS = ("loss", "cross_entropy")


class _Traced(BaseException):
    """Raised after the steps wanted: ends the script, whatever it catches (not an
    Exception: an ``except Exception`` or ``except KeyboardInterrupt`` lets it by)."""


@dataclass
class _Seen:
    """What one callable was seen doing."""

    spec: str  # as --weave names it: MODULE:FUNCTION
    kind: str  # "script", "loss", "backward", "clip"
    with_grad: int = 0
    without_grad: int = 0
    returned: Counter[str] = field(default_factory=Counter)  # kinds of values it returned
    evaluates: bool = False  # a loss was computed without gradients while it ran
    # Its first call's argument that was a global of the script with a sibling of its
    # type (val_data beside test_data): (parameter, that global, the siblings).
    data_argument: tuple[str, str, list[str]] | None = None

    @property
    def calls(self) -> int:
        return self.with_grad + self.without_grad


class _Watch:
    """The ``sys.setprofile`` function: each call of interest counted, with the grad
    mode it ran in; the script's own functions' return values classified."""

    def __init__(self, script: str) -> None:
        import torch

        self.script = script
        self.is_grad_enabled = torch.is_grad_enabled
        functional = os.path.dirname(torch.nn.functional.__file__)
        self.functional = os.path.join(functional, "functional.py")
        self.tensor = os.path.join(os.path.dirname(torch.__file__), "_tensor.py")
        self.clip = os.path.join(functional, "utils", "clip_grad.py")
        self.seen: dict[Any, _Seen] = {}
        self.stack: list[_Seen] = []  # the script's functions running now

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen = self._classify(frame)
            if seen is None:
                return
            if self.is_grad_enabled():
                seen.with_grad += 1
            else:
                seen.without_grad += 1
                if seen.kind == "loss":
                    for caller in self.stack:
                        caller.evaluates = True
            if seen.kind == "script":
                self.stack.append(seen)
                if seen.calls == 1:
                    seen.data_argument = _data_argument(frame)
        elif event == "return" and self.stack and frame.f_code.co_filename == self.script:
            seen = self.seen.get(frame.f_code)
            if seen is not None and self.stack[-1] is seen:
                self.stack.pop()
                seen.returned[_kind(arg)] += 1

    def _classify(self, frame: FrameType) -> _Seen | None:
        code = frame.f_code
        seen = self.seen.get(code)
        if seen is not None:
            return seen
        filename, name = code.co_filename, code.co_name
        if filename == self.script:
            qualname = code.co_qualname
            if name.startswith("<") or "<" in qualname or not code.co_flags & inspect.CO_OPTIMIZED:
                return None  # the module, a class body, a comprehension, a lambda, a nested function
            seen = _Seen(f"__main__:{qualname}", "script")
        elif filename == self.functional and any(w in name for w in _LOSS_WORDS) and not name.startswith("_"):
            seen = _Seen(f"torch.nn.functional:{name}", "loss")
        elif filename == self.tensor and name == "backward":
            seen = _Seen("torch.Tensor.backward", "backward")
        elif filename == self.clip and name in ("clip_grad_norm_", "clip_grad_value_"):
            seen = _Seen(f"torch.nn.utils:{name}", "clip")
        else:
            return None
        self.seen[code] = seen
        return seen


def _data_argument(frame: FrameType) -> tuple[str, str, list[str]] | None:
    """A parameter of the call in ``frame`` given a data global of the script (not a
    module, class or function: ``val_data``) that has others of its type beside it
    (``test_data``): the evaluation may be called with either, and --only tells them apart."""
    code, scope = frame.f_code, frame.f_globals
    arguments = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    for parameter in arguments:
        value = frame.f_locals.get(parameter)
        if isinstance(value, (type(None), bool, int, float, str, bytes, ModuleType)) or callable(value):
            continue  # a number or a string may be a global by chance (interned): not a data set
        name = next((n for n, v in scope.items() if v is value and not n.startswith("_")), None)
        if name is None:
            continue
        siblings = [n for n, v in scope.items() if n != name and type(v) is type(value) and not n.startswith("_")]
        if siblings:
            return parameter, name, siblings
    return None


def _kind(value: Any) -> str:
    """What a function returned, as an evaluation's result is read: a number (a float,
    a one-element tensor), a mapping of them, or something else."""
    if isinstance(value, bool):
        return "other"
    if isinstance(value, (int, float)):
        return "number"
    numel = getattr(value, "numel", None)
    if numel is not None and callable(numel) and numel() == 1:
        return "number"
    if isinstance(value, dict) and value and all(_kind(v) == "number" for v in value.values()):
        return "mapping"
    return "other"


@dataclass
class _Steps:
    """Counts the optimizers' steps (``--preset torch_optim``'s ``step``) and ends the
    script after ``wanted`` of them."""

    wanted: int
    done: int = 0
    by_optimizer: Counter[int] = field(default_factory=Counter)
    optimizers: dict[int, Any] = field(default_factory=dict)
    cycle: list[int] = field(default_factory=list)  # the optimizers in the order they step, until one steps again
    _cycled: bool = False

    def __call__(self, obj: Any) -> None:
        self.done += 1
        self.by_optimizer[id(obj)] += 1
        self.optimizers[id(obj)] = obj
        if not self._cycled:
            self._cycled = id(obj) in self.cycle
            if not self._cycled:
                self.cycle.append(id(obj))
        if self.done >= self.wanted:
            raise _Traced

    @property
    def last_of_iteration(self) -> int | None:
        """The optimizer that steps last in each iteration (dcgan: G, after D), once
        the first has stepped again; None before."""
        return self.cycle[-1] if self._cycled and len(self.cycle) > 1 else None


def trace(script: str, args: list[str], steps: int = 20, out: Any = None) -> int:
    """Trace ``script`` run with ``args`` for its first ``steps`` optimizer steps;
    print what it calls per step and a ``hookwrap run`` command; return the status."""
    from ._script_runner import run

    out = out if out is not None else sys.stdout
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"{PROG}: it needs torch (it counts torch.optim steps): pip install torch", file=sys.stderr)
        return 2
    path = os.path.abspath(script)
    watch = _Watch(path)
    counted = _Steps(steps)
    names: dict[int, str] = {}

    def name_optimizers(obj: Any) -> None:  # while the script's globals are there
        if id(obj) not in names:  # the globals looked through until the optimizer is found there, then not
            module = sys.modules.get("__main__")
            found = next((name for name, value in vars(module).items() if value is obj), None) \
                if module is not None else None
            if found is not None:
                names[id(obj)] = found
        counted(obj)

    previous = sys.getprofile()
    sys.setprofile(watch)
    ended = "ran to its end"
    spared: set[str] = set()  # the script's saves, skipped: a trace writes none of its files
    try:
        status = run(script, args, presets=["torch_optim"], callbacks=[("post-step", name_optimizers)],
                     spared=spared)
    except _Traced:
        status, ended = 0, f"stopped after {counted.done} optimizer steps (--steps {steps})"
    finally:
        sys.setprofile(previous)
    if status != 0:
        print(f"{PROG}: {script} ended with status {status} before it was traced: fix the run above.",
              file=sys.stderr)
        return status
    _report(script, args, ended, watch, counted, names, spared, out)
    return 0


def _report(script: str, args: list[str], ended: str, watch: _Watch, counted: _Steps, names: dict[int, str],
            spared: set[str], out: Any) -> None:
    steps = max(counted.done, 1)

    def say(line: str = "") -> None:
        print(line, file=out)

    say(f"{PROG}: {script} {ended}.")
    if spared:
        say(f"Its saves were skipped, so its files stay as they were: {', '.join(sorted(spared))}.")
    if not counted.done:
        say("No torch.optim optimizer stepped: nothing is counted per step, and no update to log.")
    say()
    say(f"per optimizer step ({counted.done} steps):")
    for opt_id, count in counted.by_optimizer.most_common():
        optimizer = counted.optimizers[opt_id]
        say(f"  {count / steps:6.2f}  {type(optimizer).__name__}.step  ({names.get(opt_id, 'an optimizer')})")
    seen = sorted(watch.seen.values(), key=lambda s: (-s.calls, s.spec))
    evaluation = _evaluation(seen)
    for s in seen:
        grad = ""
        if s.kind == "loss":
            grad = f"  loss: {s.with_grad} with gradients, {s.without_grad} without"
        elif s is evaluation:
            grad = "  computes a loss under torch.no_grad(): an evaluation"
            if s.data_argument is not None:
                parameter, name, siblings = s.data_argument
                grad += (f", first of {parameter}={name} (beside {', '.join(siblings)}: --only keeps it to "
                         f"{name})")
        say(f"  {s.calls / steps:6.2f}  {s.spec}{grad}")
    command = _proposal(script, args, seen, evaluation, counted, names)
    say()
    if evaluation is None and ended.startswith("stopped"):
        say(f"No evaluation was seen in these {counted.done} steps (a function of the script computing a loss "
            f"under torch.no_grad()). If the script evaluates later (after an epoch), trace again with "
            f"--steps past it: the command then logs the evaluation, and the loss of training alone "
            f"(--train-only loss).")
        say()
    last = counted.last_of_iteration
    if last is not None and names.get(last) is not None:
        say(f"{len(counted.cycle)} optimizers step in turn: the MetricsLogger counts {names[last]}'s steps, the "
            f"last of each iteration (--when), so each row is at its iteration's number.")
        say()
    say("logs the loss, the evaluation and the updates to metrics.csv:")
    say("  " + shlex.join(command))


def _evaluation(seen: list[_Seen]) -> _Seen | None:
    """The script's function that evaluates: it computed a loss under
    ``torch.no_grad()`` and returns a number or a mapping of them; of several, the
    outermost (called least often)."""
    candidates = [s for s in seen if s.kind == "script" and s.evaluates
                  and set(s.returned) & {"number", "mapping"} and not s.returned["other"]]
    return min(candidates, key=lambda s: (s.calls, s.spec)) if candidates else None


def _proposal(script: str, args: list[str], seen: list[_Seen], evaluation: _Seen | None, counted: _Steps,
              names: dict[int, str]) -> list[str]:
    command = ["hookwrap", "run", "--preset", "torch_optim"]
    losses = [s for s in seen if s.kind == "loss" and s.with_grad]
    if losses:
        loss = max(losses, key=lambda s: s.with_grad)
        command += ["--weave", f"loss={loss.spec}"]
        if loss.without_grad:
            command += ["--train-only", "loss"]
    if evaluation is not None:
        command += ["--weave", f"evaluate={evaluation.spec}"]
        if evaluation.data_argument is not None:  # the evaluation of training's: not a test set's
            parameter, name, _ = evaluation.data_argument
            command += ["--only", f"evaluate: {parameter} is {name}"]
    command += ["--callback", 'MetricsLogger("metrics.csv")']
    last = counted.last_of_iteration
    if last is not None and names.get(last) is not None:
        # Its steps counted, an iteration's losses (D's and G's) share the iteration's number.
        command += ["--when", f"obj is {names[last]}"]
    optimizers = [names.get(opt_id) for opt_id in counted.by_optimizer]
    if len(optimizers) == 1:
        command += ["--callback", 'LRMonitor(event="step")']
    elif optimizers and None not in optimizers:  # each its own learning rate, at its own update count
        for optimizer in optimizers:
            command += ["--callback", f'LRMonitor(event="step", name="lr_{optimizer}")', "--when",
                        f"obj is {optimizer}"]
    return [*command, script, *args]
