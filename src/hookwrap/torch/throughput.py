"""``Throughput``: samples, tokens and steps per second over windows of steps, and
MFU; ``measure_flops`` and ``peak_flops`` for the latter."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping
from typing import Any, Callable

from ..errors import CallbackSignatureError, HookError, SettingError
from ..extend import Defers, Ending, JoinPointInfo, reader
from ._attach import CountingCallback, DefaultEvent, On, positive_number, whole_number
from .logs_into import checked_logger, settle_logger
from .readback import QueuesReadBacks, shared

__all__ = ["Throughput", "measure_flops", "peak_flops"]

# A step counted, then the time in eval_event left out of the window: batch=None counts
# the samples= of every step; a batch name, that argument's samples.
_PAUSES = (On("pre", "eval_event", "_pause"), On("post", "eval_event", "_resume"))
_COUNTS = (On("post", "step_event", "count", extra=(None,), always=True), *_PAUSES)
_COUNTS_BATCHES = (On("post", "step_event", "count", choose="_choose_batch", always=True), *_PAUSES)


class Throughput(Defers, QueuesReadBacks, CountingCallback):
    """Samples, tokens and steps per second, every ``every`` calls of ``step_event``.

    **What is counted.** The argument ``batch`` (default ``"batch"``) of the step
    join point: a tensor counts its first dimension as samples; a mapping with
    ``input_ids`` counts that tensor's first dimension as samples and its
    ``numel()`` as tokens (padding included); another mapping counts the first
    dimension of its first tensor; a tuple or list is counted by its first element.
    Shapes only: nothing is read from the device. ``samples=`` (a function of the
    batch, or an int: the samples of every step, for a step with no batch
    argument, with ``batch=None``) and ``tokens=`` (a function of the batch, or a
    key of a mapping batch whose ``numel()`` counts) count anything else; a
    function may return a device tensor (``batch["attention_mask"].sum()``):
    it is summed on the device over the window and read back with the other
    shipped callbacks' values (:mod:`hookwrap.torch.readback`), not per step.

    **What is timed.** ``clock()`` (``time.perf_counter``) from the start of the
    window's first step to the end of its last: everything in between counts (data
    loading included) except the calls of ``eval_event`` (default ``"evaluate"``,
    where the target has it). On CUDA the host runs ahead of the device, so this is
    the rate at which steps were *queued*; over a window it matches the device's
    rate once the launch queue is full (a loop that reads its loss each step is
    synchronised anyway), and is off by at most the queue's lag at the window's two
    ends. ``sync=True`` calls ``torch.cuda.synchronize()`` once per window, before
    the clock is read at its end: exact, at one device wait every ``every`` steps.
    Never a wait per step. A window left unfinished when ``fit_event`` ends is
    dropped, and the next ``fit`` starts a new one.

    **MFU.** With ``flops_per_sample`` (forward and backward of one sample, e.g.
    ``measure_flops(model, example) / len(example)``), ``mfu`` is
    ``flops_per_sample * samples_per_sec / peak`` where ``peak`` is
    ``peak_flops=`` (FLOP/s of one device) or, on CUDA, looked up by device name
    and ``dtype`` (``peak_flops()``); on the CPU it must be given. Per process:
    samples of this rank, one device's peak.

    Reports ``steps_per_sec``, ``samples_per_sec``, ``tokens_per_sec`` (where
    tokens are counted), ``flops_per_sec`` and ``mfu`` (with ``flops_per_sample``),
    each to ``logger`` (a MetricsLogger, or any ``log_metrics`` logger) and kept in ``history`` as
    ``(step, {name: value})``.
    """

    def __init__(self, every: int = 10, batch: str | None = "batch", samples: Any = None,
                 tokens: Any = None, flops_per_sample: float | None = None, peak_flops: float | None = None,
                 device: Any = None, dtype: Any = None, sync: bool = False, logger: Any = None,
                 step_event: str = "step", eval_event: str | None = DefaultEvent("evaluate"),
                 fit_event: str | None = DefaultEvent("fit"), clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(step_event)
        where = "Throughput"
        self.every = whole_number(every, "every", where)
        if batch is not None and (not isinstance(batch, str) or not batch.isidentifier()):
            raise SettingError(f"{where}: batch must be the name of the step join point's argument that "
                               f"carries the batch (default 'batch'), or None; got {batch!r}.")
        if isinstance(samples, bool) or not (samples is None or callable(samples)
                                             or (isinstance(samples, int) and samples >= 1)):
            raise SettingError(f"{where}: samples must be a function of the batch returning its number of "
                               f"samples, or a whole number >= 1 (the samples of every step); got {samples!r}.")
        if batch is None and not isinstance(samples, int):
            raise HookError(f"{where}: with batch=None there is no batch to pass to samples=; pass "
                            f"samples= a whole number (the samples of every step) or batch= the argument name.")
        if tokens is not None and not callable(tokens) and not (isinstance(tokens, str) and tokens):
            raise SettingError(f"{where}: tokens must be a function of the batch returning its number of "
                               f"tokens, or the key of a mapping batch whose numel() counts them; got {tokens!r}.")
        if tokens is not None and batch is None:
            raise HookError(f"{where}: tokens= needs a batch to count them from; pass batch= the name of "
                            f"the step join point's argument that carries it.")
        if not isinstance(sync, bool):
            raise SettingError(f"{where}: sync must be True or False, got {sync!r}.")
        if not callable(clock):
            raise SettingError(f"{where}: clock must be a function returning seconds (time.perf_counter), "
                               f"got {clock!r}.")
        logger = checked_logger(logger, where)
        self.batch, self.samples, self.tokens, self.sync = batch, samples, tokens, sync
        self.logger, self.eval_event, self.fit_event, self.clock = logger, eval_event, fit_event, clock
        self.device = _device(device, where)
        self.flops_per_sample: float | None = None
        self.peak: float | None = None
        if flops_per_sample is not None:
            self.flops_per_sample = positive_number(
                flops_per_sample, "flops_per_sample", where,
                why="the FLOPs of one sample's forward and backward: measure_flops(model, example) / len(example)")
            self.peak = _peak(peak_flops, self.device, dtype, where)
        elif peak_flops is not None:
            _check_peak(peak_flops, where)
            raise HookError(f"{where}: peak_flops= is used for MFU, which needs flops_per_sample= too "
                            f"(measure_flops(model, example) / len(example)); pass it, or leave peak_flops out.")
        if sync and self.device.type != "cuda":
            raise HookError(f"{where}: sync=True synchronizes CUDA, but the device is {self.device}; pass "
                            f"device='cuda' or leave sync out.")
        self._history: list[tuple[int, dict[str, float]]] = []
        self._queued = 0  # windows whose tensor counts are not read back yet
        self._open()

    def _open(self, start: float | None = None) -> None:
        """Start a window at ``start`` (the end of the last one: what runs between
        two steps counts), or, with None, at the next step's start."""
        self._start: float | None = start
        self._excluded = 0.0  # seconds of eval_event inside the window
        self._paused: float | None = None
        self._steps = 0
        self._samples: Any = 0  # an int, or a list of tensors to sum on the device
        self._tokens: Any = None  # None: no tokens counted in this window

    # -- events ------------------------------------------------------------------

    follows_updates = False  # it reads each batch at its step event: a window of batches, on any loop

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        pairs = self.registrations(target, _COUNTS if self.batch is None else _COUNTS_BATCHES)
        self.run_event = self.fit_event if self.wants(target, self.fit_event) else None
        return pairs  # fit_event: a boundary (Defers), where the open window is dropped

    def defers(self) -> bool:
        # A logger to settle, or a window to drop when fit ends (however it ends).
        return self.logger is not None or self.run_event is not None

    def settle(self, obj: Any, ending: Ending) -> None:
        if ending.where == "fit":
            self._open()
        settle_logger(self.logger, obj, ending)

    def _choose_batch(self, jp: JoinPointInfo) -> Any:
        if self.batch not in jp.arguments:
            raise CallbackSignatureError(
                f"{self.where}: {jp.where} has no argument {self.batch!r} to count samples from (its "
                f"arguments: {', '.join(jp.arguments) or 'none'}). Pass batch= the name of the argument that "
                f"carries the batch, or batch=None with samples= the samples of every step.")
        return reader(self.count, "post-", self.batch)

    def _count_step(self, obj: Any) -> None:  # pre-step: counts the step, opens a window
        self.step += 1
        if self._start is None:
            self._start = self.clock()

    def _pause(self, obj: Any) -> None:
        if self._start is not None:
            self._paused = self.clock()

    def _resume(self, obj: Any) -> None:
        if self._paused is not None:
            self._excluded += self.clock() - self._paused
            self._paused = None

    def count(self, obj: Any, batch: Any) -> None:
        """After each step: count its samples and tokens; report every ``every`` steps."""
        samples, tokens = self._count(batch)
        self._steps += 1
        self._samples = _add(self._samples, samples)
        if tokens is not None:
            self._tokens = tokens if self._tokens is None else _add(self._tokens, tokens)
        if self.step % self.every == 0 and self._start is not None:
            self._report()

    def _count(self, batch: Any) -> tuple[Any, Any]:
        """(samples, tokens) of one step: ints, or one-element device tensors."""
        samples: Any = self.samples
        if self.batch is None:  # samples is a whole number
            return samples, None
        found: tuple[int | None, int | None] | None = None
        if samples is None:
            found = _count_batch(batch)
            samples = found[0]
            if samples is None:
                raise HookError(
                    f"{self.where}: cannot count the samples of the batch at step {self.step} (a "
                    f"{type(batch).__name__}): it counts a tensor's first dimension, a mapping's "
                    f"'input_ids' or first tensor, or a tuple's or list's first element. Pass samples= a "
                    f"function of the batch returning its number of samples.")
        elif callable(samples):
            samples = _number(samples(batch), "samples", self.where)
        if self.tokens is None:
            return samples, (found if found is not None else _count_batch(batch))[1]
        if callable(self.tokens):
            return samples, _number(self.tokens(batch), "tokens", self.where)
        value: Any = batch.get(self.tokens) if isinstance(batch, Mapping) else None
        if not _is_batched(value):
            raise HookError(
                f"{self.where}: the batch at step {self.step} (a {type(batch).__name__}) has no tensor "
                f"{self.tokens!r} to count tokens from. Pass tokens= the key of one, or a function of "
                f"the batch returning its number of tokens.")
        return samples, int(value.numel())

    # -- a window's report ---------------------------------------------------------

    def _report(self) -> None:
        if self.sync:
            import torch

            torch.cuda.synchronize(self.device)
        assert self._start is not None
        now = self.clock()
        elapsed = now - self._start - self._excluded
        if elapsed <= 0:  # a clock too coarse for this window: it goes on into the next
            return
        metrics: dict[str, Any] = {"steps_per_sec": self._steps / elapsed}
        samples = _total(self._samples)
        metrics["samples_per_sec"] = samples / elapsed
        if self._tokens is not None:
            metrics["tokens_per_sec"] = _total(self._tokens) / elapsed
        if self.flops_per_sample is not None and self.peak is not None:
            flops_per_sec = metrics["samples_per_sec"] * self.flops_per_sample
            metrics["flops_per_sec"] = flops_per_sec
            metrics["mfu"] = flops_per_sec / self.peak
        self._open(now)
        if self.logger is not None:
            for name, value in metrics.items():
                self.logger.log(name, value, self.step)
        self._keep(self.step, metrics)

    def _keep(self, step: int, metrics: dict[str, Any]) -> None:
        on_device = [name for name, value in metrics.items() if hasattr(value, "detach")]
        if not on_device:
            self._history.append((step, metrics))
            return
        import torch

        self._queued += 1
        values = torch.stack([metrics[name].detach().to(torch.float64).reshape(()) for name in on_device])
        shared().put(values, functools.partial(self._deliver, step, metrics, on_device))

    def _deliver(self, step: int, metrics: dict[str, Any], names: list[str], values: list[float]) -> None:
        self._queued -= 1
        self._history.append((step, {**metrics, **dict(zip(names, values))}))

    @property
    def history(self) -> list[tuple[int, dict[str, float]]]:
        """``(step, {name: value})`` per window reported (waits for values still queued)."""
        if self._queued:
            shared().read(wait=True)
        return self._history

    @property
    def last(self) -> dict[str, float] | None:
        return self.history[-1][1] if self.history else None

    def summary(self) -> str:
        """One line: the mean of each rate over the windows reported (``hookwrap run``
        prints it at the end)."""
        history = self.history
        if not history:
            return f"Throughput: no window of {self.every} steps completed"
        names = list(history[-1][1])
        means = {name: sum(m[name] for _, m in history if name in m) / sum(1 for _, m in history if name in m)
                 for name in names}
        return (f"Throughput: {len(history)} windows of {self.every} steps, mean "
                + ", ".join(f"{name} {value:.4g}" for name, value in means.items()))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "history": [(step, dict(m)) for step, m in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._history = [(step, dict(m)) for step, m in state.get("history", [])]
        self._open()  # the next step opens a new window

    def __setstate__(self, state: dict[str, Any]) -> None:
        # The window's start was read on the saving process's clock, whose origin
        # (perf_counter's) another process does not share: the next step opens one.
        self.__dict__.update(state)
        self._open()


def _count_batch(batch: Any) -> tuple[int | None, int | None]:
    """(samples, tokens) of a batch by its shapes: ``(None, None)`` where it cannot say."""
    if isinstance(batch, (tuple, list)):
        return _count_batch(batch[0]) if batch else (None, None)
    shape = getattr(batch, "shape", None)  # a tensor (checked before Mapping: cheaper)
    if shape is not None:
        return (shape[0], None) if len(shape) >= 1 else (None, None)
    if isinstance(batch, Mapping):
        ids: Any = batch.get("input_ids")
        if _is_batched(ids):
            return ids.shape[0], ids.numel()
        for value in batch.values():
            if _is_batched(value):
                return value.shape[0], None
    return None, None


def _is_batched(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    return shape is not None and hasattr(value, "numel") and len(shape) >= 1


def _add(total: Any, value: Any) -> Any:
    """Two counts added: ints at once, tensors listed to be summed on the device."""
    if isinstance(total, int) and isinstance(value, int):
        return total + value
    return [*(total if isinstance(total, list) else [total]), value]


def _number(value: Any, what: str, where: str) -> Any:
    """An int, or a one-element device tensor (summed on the device, read back later)."""
    if hasattr(value, "detach") and hasattr(value, "numel") and value.numel() == 1:
        return value.detach().reshape(())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HookError(f"{where}: the {what}= function must return a whole number >= 0 or a one-element "
                        f"tensor, got {value!r}.")
    return value


def _total(counts: Any) -> Any:
    """An int as is; a list of ints and tensors summed on the device (a 0-dim tensor)."""
    if not isinstance(counts, list):
        return counts
    import torch

    tensors = [c for c in counts if not isinstance(c, int)]
    ints = sum(c for c in counts if isinstance(c, int))
    total = torch.stack([t.to(torch.float64) for t in tensors]).sum()
    return total + ints if ints else total


def _device(device: Any, where: str) -> Any:
    import torch

    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise SettingError(f"{where}: device must be a torch.device or a name like 'cuda' or 'cpu', "
                           f"got {device!r}.") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise HookError(f"{where}(device={device!r}): CUDA is not available here; pass device='cpu'.")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def _check_peak(value: Any, where: str) -> float:
    return positive_number(value, "peak_flops", where, why=(
        "the FLOP/s one device can do at the training dtype: its datasheet's dense figure, e.g. 989.4e12 "
        "for an H100 SXM in bfloat16"))


def _peak(value: Any, device: Any, dtype: Any, where: str) -> float:
    if value is not None:
        return _check_peak(value, where)
    if device.type != "cuda":
        raise HookError(f"{where}: MFU (flops_per_sample=) needs the device's peak FLOP/s, and there is no "
                        f"table for {device.type!r}: pass peak_flops= the FLOP/s of one device at the "
                        f"training dtype.")
    found = peak_flops(device, dtype)
    if found is None:
        import torch

        raise HookError(f"{where}: no peak FLOP/s known for {torch.cuda.get_device_name(device)!r} in "
                        f"{_dtype_name(dtype)}: pass peak_flops= the device's dense FLOP/s at that dtype, "
                        f"from its datasheet.")
    return found


# Dense (no sparsity) peak FLOP/s per device, from NVIDIA's datasheets; "tf32" is
# float32 matmuls on tensor cores (torch.backends.cuda.matmul.allow_tf32, or
# torch.set_float32_matmul_precision("high")). Matched against the device's name,
# word by word: the first entry that fits, most specific first.
_CUDA_PEAKS: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = (
    (("h200", "nvl"), {"float64": 30e12, "float32": 60e12, "tf32": 417.5e12, "bfloat16": 835.5e12,
                       "float16": 835.5e12}),
    (("h200",), {"float64": 34e12, "float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12,
                 "float16": 989.4e12}),
    (("h100", "nvl"), {"float64": 30e12, "float32": 60e12, "tf32": 417.5e12, "bfloat16": 835.5e12,
                       "float16": 835.5e12}),
    (("h100", "pcie"), {"float64": 25.6e12, "float32": 51.2e12, "tf32": 378e12, "bfloat16": 756e12,
                        "float16": 756e12}),
    (("h100",), {"float64": 33.5e12, "float32": 66.9e12, "tf32": 494.7e12, "bfloat16": 989.4e12,
                 "float16": 989.4e12}),  # SXM ("NVIDIA H100 80GB HBM3")
    (("a100",), {"float64": 9.7e12, "float32": 19.5e12, "tf32": 156e12, "bfloat16": 312e12, "float16": 312e12}),
    (("a10g",), {"float32": 31.2e12, "tf32": 62.5e12, "bfloat16": 125e12, "float16": 125e12}),
    (("l40s",), {"float32": 91.6e12, "tf32": 183e12, "bfloat16": 362.05e12, "float16": 362.05e12}),
    (("l4",), {"float32": 30.3e12, "tf32": 60e12, "bfloat16": 121e12, "float16": 121e12}),
    (("v100",), {"float64": 7.8e12, "float32": 15.7e12, "float16": 125e12}),  # SXM2; PCIe is ~10% lower
    (("t4",), {"float32": 8.1e12, "float16": 65e12}),
)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.") if dtype is not None else "float32"


def peak_flops(device: Any = None, dtype: Any = None) -> float | None:
    """The dense peak FLOP/s of one CUDA ``device`` (default the current one) at
    ``dtype`` (``torch.bfloat16``, ``torch.float16``, ``torch.float32``, the
    default, or ``"tf32"``; float32 counts as tf32 where tensor cores take float32
    matmuls: ``torch.get_float32_matmul_precision() != "highest"`` on Ampere or
    later), from a small table of NVIDIA datacenter GPUs (H200, H100, A100, A10G,
    L40S, L4, V100, T4); ``None`` for another device or dtype, or without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type != "cuda":
        return None
    name = _dtype_name(dtype)
    if name == "float32" and torch.get_float32_matmul_precision() != "highest" \
            and torch.cuda.get_device_capability(device) >= (8, 0):
        name = "tf32"
    return lookup_peak(torch.cuda.get_device_name(device), name)


def lookup_peak(device_name: str, dtype_name: str) -> float | None:
    """The table's dense FLOP/s for a device named ``device_name`` (as
    ``torch.cuda.get_device_name`` says it) at ``dtype_name``, or ``None``."""
    tokens = set(re.split(r"[^0-9a-z]+", device_name.lower()))  # whole words: "l4" is not "l40"
    for words, peaks in _CUDA_PEAKS:
        if all(word in tokens for word in words):
            return peaks.get(dtype_name)
    return None


def measure_flops(model: Any, *inputs: Any, backward: bool = True,
                  loss: Callable[[Any], Any] | None = None) -> int:
    """The FLOPs of one call ``model(*inputs)``, and of its backward pass with
    ``backward=True``, counted once with ``torch.utils.flop_counter.FlopCounterMode``
    (matrix multiplications and convolutions; elementwise work is not counted).
    The backward computes the gradients of ``loss(output)`` (default
    ``output.sum()``) for the parameters that require one, with
    ``torch.autograd.grad``: the model's ``.grad`` are left as they were. A
    ``torch.nn.Linear(i, o)`` on a batch of ``n`` counts ``2*n*i*o`` forward and as
    much again for its weight's gradient (a third ``2*n*i*o`` for the input's
    gradient where the input needs one, as every layer after the first does).
    Divide by the batch size for ``Throughput(flops_per_sample=...)``. Runs the
    model: use a small example batch, or a model on the ``meta`` device."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    if not callable(model):
        raise SettingError(f"measure_flops: model must be a module (callable), got {type(model).__name__}.")
    counter = FlopCounterMode(display=False)
    with counter:
        output = model(*inputs)
        if backward:
            params = [p for p in model.parameters() if p.requires_grad] if hasattr(model, "parameters") else []
            value = loss(output) if loss is not None else output.sum()
            if params:
                torch.autograd.grad(value, params, allow_unused=True)
    return int(counter.get_total_flops())
