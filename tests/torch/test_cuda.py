"""The callbacks that change the loop, and the new monitors, on CUDA: the same
numbers as the loop written by hand on the same device, and no device sync in
the loop (``torch.cuda.set_sync_debug_mode("error")`` raises on any). Skipped,
with the reason, where there is no CUDA device; the CPU tests of each callback
run everywhere (test_loop_changes, test_ema_autocast, ...)."""

from __future__ import annotations

import collections
import contextlib
import json
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (none on this machine)")

STEPS = 6


@contextlib.contextmanager
def no_device_sync() -> Iterator[None]:
    """Any synchronizing CUDA call in the block raises."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def data(device: str = "cuda") -> list[tuple[Any, Any]]:
    """The batches, already on ``device``: build them before ``no_device_sync()``,
    since a copy from pageable host memory synchronizes."""
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, generator=gen).mul(5).to(device), torch.randn(8, 2, generator=gen).to(device))
            for _ in range(STEPS)]


def make_loop(hw: Any, device: str = "cuda") -> Any:
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(3, 2).to(device)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.5, momentum=0.9)

        @hw.hookable
        def step(self, batch: Any) -> Any:
            x, y = batch
            loss = self.loss(self.model(x), y)
            self.backward(loss)
            self.optimizer_step()
            return loss.detach()

        @hw.hookable
        def loss(self, out: Any, y: Any) -> Any:
            return torch.nn.functional.mse_loss(out.float(), y)

        @hw.hookable
        def backward(self, loss: Any) -> None:
            loss.backward()

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

        @hw.hookable
        def evaluate(self, x: Any) -> Any:
            return self.model(x).detach()

    return Loop()


def same_weights(a: Any, b: Any) -> None:
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_grad_clip_on_cuda_equals_the_hand_loop_without_a_sync(hw, ht):
    loop, hand, batches = make_loop(hw), make_loop(hw), data()
    loop.add_callback(ht.GradClip(0.05))
    with no_device_sync():
        for batch in batches:
            loop.step(batch)
    for x, y in batches:
        torch.nn.functional.mse_loss(hand.model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(hand.model.parameters(), 0.05)
        hand.optimizer.step()
        hand.optimizer.zero_grad(set_to_none=True)
    same_weights(loop.model, hand.model)


def test_grad_accumulation_with_clipping_on_cuda_equals_the_hand_loop_without_a_sync(hw, ht):
    loop, hand, batches = make_loop(hw), make_loop(hw), data()
    loop.add_callback(ht.GradAccumulation(3, clip_grad_norm=0.05))
    with no_device_sync():
        for batch in batches:
            loop.step(batch)
    for i, (x, y) in enumerate(batches):
        (torch.nn.functional.mse_loss(hand.model(x), y) / 3).backward()
        if (i + 1) % 3 == 0:
            torch.nn.utils.clip_grad_norm_(hand.model.parameters(), 0.05)
            hand.optimizer.step()
            hand.optimizer.zero_grad(set_to_none=True)
    same_weights(loop.model, hand.model)


def test_ema_on_cuda_averages_as_on_the_cpu_without_a_sync(hw, ht):
    on_cuda, on_cpu = make_loop(hw), make_loop(hw, "cpu")
    ema_cuda, ema_cpu = ht.EMA(0.9), ht.EMA(0.9)
    on_cuda.add_callback(ema_cuda)
    on_cpu.add_callback(ema_cpu)
    batches = data()  # copied to the device before the check: a host-to-device copy synchronizes
    with no_device_sync():
        for batch in batches:
            on_cuda.step(batch)
    for batch in data("cpu"):
        on_cpu.step(batch)
    probe = torch.ones(2, 3)
    seen_cuda = on_cuda.evaluate(probe.cuda()).cpu()  # the average, swapped in for evaluate
    seen_cpu = on_cpu.evaluate(probe)
    assert torch.allclose(seen_cuda, seen_cpu, atol=1e-5)
    assert not torch.allclose(seen_cuda, on_cuda.model(probe.cuda()).detach().cpu())  # swapped back


def test_autocast_on_cuda_runs_the_step_in_float16(hw, ht):
    loop = make_loop(hw)
    dtypes = []
    loop.after("loss", lambda self, out, y, return_value: dtypes.append(out.dtype) or return_value)
    loop.add_callback(ht.Autocast(("step",)))
    batch = data()[0]
    with no_device_sync():
        loop.step(batch)
    assert dtypes == [torch.float16]


def test_profiler_on_cuda_records_the_ranges_and_the_kernels(hw, ht, tmp_path):
    loop = make_loop(hw)
    profiler = ht.Profiler(dir=tmp_path, wait=0, warmup=1, active=3, step_event="step",
                           events=("step", "loss", "backward", "optimizer_step"))
    loop.add_callback(profiler)
    for batch in data():
        loop.step(batch)
    with open(profiler.traces[0]) as f:
        events = json.load(f)["traceEvents"]
    ranges = collections.Counter(e["name"] for e in events if e.get("cat") == "user_annotation"
                                 and e["name"].startswith("hookwrap:"))
    assert ranges == {f"hookwrap:{e}": 3 for e in ("step", "loss", "backward", "optimizer_step")}
    assert any(e.get("cat") == "kernel" for e in events)


def test_metrics_logger_and_monitors_on_cuda_read_back_without_a_sync_per_step(hw, ht, tmp_path):
    class Sink:
        def __init__(self) -> None:
            self.rows: list[tuple[int, dict[str, float]]] = []

        def log_metrics(self, metrics: dict[str, float], step: int) -> None:
            self.rows.append((step, dict(metrics)))

    loop, sink = make_loop(hw), Sink()
    log = ht.MetricsLogger(loggers=[sink])
    throughput = ht.Throughput(every=3, logger=log)
    memory = ht.MemoryMonitor(every=3, logger=log)
    for callback in (log, throughput, memory):
        loop.add_callback(callback)
    batches = data()
    with no_device_sync():
        losses = [loop.step(batch) for batch in batches]
    log.close()  # reads back what is queued, once
    logged = [(step, m["loss"]) for step, m in sink.rows if "loss" in m]
    assert logged == [(i + 1, pytest.approx(loss.item())) for i, loss in enumerate(losses)]
    names = {name for _, m in sink.rows for name in m}
    assert {"samples_per_sec", "steps_per_sec", "rss_mib", "cuda_allocated_mib", "cuda_reserved_mib"} <= names
    assert [step for step, _ in throughput.history] == [3, 6] and [s for s, _ in memory.history] == [3, 6]
