"""Throughput, measure_flops, peak_flops and MemoryMonitor (hookwrap.torch).

Never timed: Throughput takes ``clock=``, here a fake clock the loop advances by a
fixed amount per step (and per evaluation), so every rate is an exact number.
Sizes in binary fractions (0.25 s) keep the arithmetic exact."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")
pytest.importorskip("tqdm", reason="needs the torch extra (tqdm)")

from tests.torch.test_host_reads import tiny_loop  # noqa: E402 (needs torch)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (none on this machine)")


class Clock:
    """A clock the loop advances; pickles by reference (module level)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Log:
    """A logger: what log_metrics(metrics, step) got, a row per value."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, Any]] = []

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        self.rows.extend((step, name, value) for name, value in metrics.items())


STEP, EVAL = 0.25, 10.0  # seconds a step, an evaluation, take on the fake clock


def make_loop(hw: Any, batches: list[Any], clock: Clock) -> Any:
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.batches = batches
            self.steps = 0

        @hw.hookable
        def fit(self, epochs: int) -> None:
            for _ in range(epochs):
                self.epoch()
                self.evaluate()

        @hw.hookable
        def epoch(self) -> None:
            for batch in self.batches:
                self.step(batch)

        @hw.hookable
        def step(self, batch: Any) -> None:
            self.steps += 1
            clock.now += STEP

        @hw.hookable
        def evaluate(self) -> dict[str, float]:
            clock.now += EVAL
            return {"val_loss": 1.0}

    return Loop()


SIZES = [3, 5, 8, 2, 7, 4]  # samples per batch, one epoch of 6 steps


def tensors() -> list[Any]:
    return [torch.zeros(n, 4) for n in SIZES]


def windows(sizes: list[int], every: int, epochs: int) -> list[tuple[int, int]]:
    """(step, samples) of each full window, counted by hand."""
    per_step = sizes * epochs
    return [(end, sum(per_step[end - every:end])) for end in range(every, len(per_step) + 1, every)]


# --- counting and timing ---------------------------------------------------------


def test_samples_and_steps_per_second_exact(hw, ht):
    clock, log = Clock(), Log()
    loop = make_loop(hw, tensors(), clock)
    meter = ht.Throughput(every=4, clock=clock, logger=log)
    loop.add_callback(meter)
    loop.fit(3)  # 18 steps: windows end at 4, 8, 12, 16; steps 17-18 are dropped when fit ends
    expected = windows(SIZES, 4, 3)[:4]
    assert [step for step, _ in meter.history] == [4, 8, 12, 16]
    for (step, metrics), (_, samples) in zip(meter.history, expected):
        # Each window is 4 steps of 0.25 s: the evaluations inside windows 2 and 3 are left out.
        assert metrics == {"steps_per_sec": 4.0, "samples_per_sec": samples / 1.0}
    assert [(s, n) for s, n, _ in log.rows] == [(s, n) for s in (4, 8, 12, 16)
                                                for n in ("steps_per_sec", "samples_per_sec")]
    assert meter.last == meter.history[-1][1]


def test_an_evaluation_inside_a_window_is_not_timed(hw, ht):
    clock = Clock()
    loop = make_loop(hw, tensors(), clock)
    meter = ht.Throughput(every=4, clock=clock)
    loop.add_callback(meter)
    loop.fit(2)
    assert clock.now == 12 * STEP + 2 * EVAL
    assert [m["steps_per_sec"] for _, m in meter.history] == [4.0, 4.0, 4.0]
    timed_with_eval = ht.Throughput(every=4, clock=clock, eval_event=None)
    loop2 = make_loop(hw, tensors(), clock)
    loop2.add_callback(timed_with_eval)
    loop2.fit(2)
    assert [m["steps_per_sec"] for _, m in timed_with_eval.history] == [4.0, 4 / (1.0 + EVAL), 4.0]


@pytest.mark.parametrize("every", [1, 2, 5])
def test_time_between_steps_counts_in_every_window(hw, ht, every):
    """Data loading outside the step join point is part of what a window times,
    between its steps and between two windows alike: the end-to-end rate."""
    clock = Clock()
    loop = make_loop(hw, tensors(), clock)
    meter = ht.Throughput(every=every, clock=clock)
    loop.add_callback(meter)
    for batch in tensors() * 5:  # 30 steps, each after 0.75 s of loading
        clock.now += 0.75
        loop.step(batch)
    assert len(meter.history) == 30 // every
    for _, metrics in meter.history[1:]:  # the first window opens at its first step
        assert metrics["steps_per_sec"] == 1.0  # 0.75 s loading + 0.25 s step


def test_a_window_pickled_mid_way_is_not_timed_on_another_clock(hw, ht):
    """perf_counter's origin differs between processes: a window opened before
    pickling is dropped on load, and the next step opens one."""
    clock = Clock()
    clock.now = 5000.0
    loop = make_loop(hw, tensors(), clock)
    meter = ht.Throughput(every=4, clock=clock)
    loop.add_callback(meter)
    for batch in tensors():  # window 1 reported at step 4; window 2 open at step 6
        loop.step(batch)
    restored = pickle.loads(pickle.dumps(meter))
    restored.clock = clock  # time.perf_counter pickles by name: the loading process's own
    clock.now = 0.0  # whose origin is another
    loop2 = make_loop(hw, tensors(), clock)
    loop2.add_callback(restored)
    for batch in tensors() * 2:  # steps 7-18: a window opens at 7, reports at 8, 12, 16
        loop2.step(batch)
    assert [step for step, _ in restored.history] == [4, 8, 12, 16]
    assert [m["steps_per_sec"] for _, m in restored.history] == [4.0, 4.0, 4.0, 4.0]


def test_tokens_from_input_ids_and_batches_in_tuples(hw, ht):
    clock = Clock()
    lengths = [16, 9, 30, 12]
    batches = [({"input_ids": torch.ones(n, t, dtype=torch.long), "labels": torch.zeros(n)}, "extra")
               for n, t in zip([2, 3, 4, 1], lengths)]
    loop = make_loop(hw, batches, clock)
    meter = ht.Throughput(every=2, clock=clock)
    loop.add_callback(meter)
    loop.fit(1)
    # window 1: 2x16 + 3x9 tokens, 5 samples; window 2: 4x30 + 1x12, 5 samples; 0.5 s each
    assert meter.history == [(2, {"steps_per_sec": 4.0, "samples_per_sec": 10.0, "tokens_per_sec": 118.0}),
                             (4, {"steps_per_sec": 4.0, "samples_per_sec": 10.0, "tokens_per_sec": 264.0})]


def test_mappings_without_input_ids_and_user_counters(hw, ht):
    clock = Clock()
    batches = [{"image": torch.zeros(n, 3, 2, 2), "label": torch.zeros(n)} for n in (4, 6)]
    loop = make_loop(hw, batches, clock)
    plain = ht.Throughput(every=2, clock=clock)
    counted = ht.Throughput(every=2, clock=clock, samples=lambda b: 2 * len(b["label"]),
                            tokens=lambda b: int(b["image"].numel()))
    keyed = ht.Throughput(every=2, clock=clock, tokens="image")
    for meter in (plain, counted, keyed):
        loop.add_callback(meter)
    loop.fit(1)
    assert plain.history == [(2, {"steps_per_sec": 4.0, "samples_per_sec": 20.0})]
    assert counted.history == [(2, {"steps_per_sec": 4.0, "samples_per_sec": 40.0, "tokens_per_sec": 240.0})]
    assert keyed.history == [(2, {"steps_per_sec": 4.0, "samples_per_sec": 20.0, "tokens_per_sec": 240.0})]


def test_tokens_counted_on_the_device_are_read_back_batched(hw, ht):
    """attention_mask.sum() per step: a device value, summed over the window on the
    device and read back with the other queued values, never per step."""
    clock, log = Clock(), Log()
    masks = [torch.tensor([[1, 1, 0], [1, 0, 0]]), torch.tensor([[1, 1, 1]]),
             torch.tensor([[1, 0, 0], [1, 1, 0]]), torch.tensor([[0, 0, 0]])]
    batches = [{"input_ids": torch.ones_like(m), "attention_mask": m} for m in masks]
    loop = make_loop(hw, batches, clock)
    meter = ht.Throughput(every=2, clock=clock, tokens=lambda b: b["attention_mask"].sum(), logger=log)
    loop.add_callback(meter)
    with ht.count_host_reads() as reads:
        loop.epoch()
    assert reads.count == 0 and log.rows == []  # held: read back in a batch at a boundary, never per step
    with ht.count_host_reads() as reads:
        hw.callback_state(loop)  # a boundary (as the end of fit): the logger's rows are delivered
    assert reads.count == 1
    assert [(step, value) for step, name, value in log.rows if name == "tokens_per_sec"] == [(2, 12.0), (4, 6.0)]
    with ht.count_host_reads() as reads:
        history = meter.history  # read already, with the logger's values
    assert reads.count == 0
    assert history == [(2, {"steps_per_sec": 4.0, "samples_per_sec": 6.0, "tokens_per_sec": 12.0}),
                       (4, {"steps_per_sec": 4.0, "samples_per_sec": 6.0, "tokens_per_sec": 6.0})]


def test_both_log_through_a_metrics_logger(hw, ht, tmp_path):
    clock = Clock()
    masks = [torch.tensor([[1, 1, 0]]), torch.tensor([[1, 0, 0], [1, 1, 1]])]
    loop = make_loop(hw, [{"input_ids": torch.ones_like(m), "attention_mask": m} for m in masks], clock)
    log = ht.MetricsLogger(tmp_path / "metrics.csv", tensorboard=False)
    loop.add_callback(log)
    loop.add_callback(ht.Throughput(every=2, clock=clock, tokens=lambda b: b["attention_mask"].sum(), logger=log))
    loop.add_callback(ht.MemoryMonitor(every=2, device="cpu", logger=log))
    with ht.count_host_reads() as reads:
        loop.fit(1)
    assert reads.count == 1  # the logger's read-back when the run ends: the device token count
    rows = {name: (step, value) for step, name, value in log.read()}
    assert rows["steps_per_sec"] == (2, 4.0) and rows["samples_per_sec"] == (2, 6.0)
    assert rows["tokens_per_sec"] == (2, 12.0)
    assert rows["rss_mib"][0] == 2 and rows["rss_mib"][1] > 0


def test_a_step_without_a_batch_argument_counts_a_fixed_number(hw, ht):
    clock = Clock()

    class Loop(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            clock.now += STEP

    loop = Loop()
    meter = ht.Throughput(every=2, batch=None, samples=32, clock=clock)
    loop.add_callback(meter)
    for _ in range(4):
        loop.step()
    assert meter.history == [(2, {"steps_per_sec": 4.0, "samples_per_sec": 128.0}),
                             (4, {"steps_per_sec": 4.0, "samples_per_sec": 128.0})]
    with pytest.raises(hw.CallbackSignatureError, match=r"Throughput: .* has no argument 'batch' to count "
                                                        r"samples from .*Pass batch= the name"):
        Loop().add_callback(ht.Throughput())


def test_mfu_is_flops_per_sample_times_samples_per_second_over_the_peak(hw, ht):
    clock, log = Clock(), Log()
    loop = make_loop(hw, tensors(), clock)
    meter = ht.Throughput(every=3, clock=clock, flops_per_sample=1536.0, peak_flops=2.0**20, logger=log)
    loop.add_callback(meter)
    loop.fit(1)
    for (step, metrics), (_, samples) in zip(meter.history, windows(SIZES, 3, 1), strict=True):
        samples_per_sec = samples / 0.75
        assert metrics["samples_per_sec"] == samples_per_sec
        assert metrics["flops_per_sec"] == 1536.0 * samples_per_sec
        assert metrics["mfu"] == 1536.0 * samples_per_sec / 2.0**20
    assert {name for _, name, _ in log.rows} == {"steps_per_sec", "samples_per_sec", "flops_per_sec", "mfu"}


def test_measure_flops_matches_a_hand_count(ht):
    n, i, h, o = 5, 4, 6, 3
    x = torch.randn(n, i)
    linear = torch.nn.Linear(i, o)
    assert ht.measure_flops(linear, x, backward=False) == 2 * n * i * o
    # Backward: the weight's gradient (2*n*i*o); the input needs none.
    assert ht.measure_flops(linear, x) == 2 * (2 * n * i * o)
    mlp = torch.nn.Sequential(torch.nn.Linear(i, h), torch.nn.ReLU(), torch.nn.Linear(h, o))
    forward = 2 * n * (i * h + h * o)
    # The second layer also computes its input's gradient: forward x3 for it, x2 for the first.
    assert ht.measure_flops(mlp, x) == forward + 2 * n * h * o * 2 + 2 * n * i * h
    assert all(p.grad is None for p in mlp.parameters())  # the model's gradients are untouched
    assert ht.measure_flops(mlp, x, loss=lambda out: (out ** 2).mean()) == ht.measure_flops(mlp, x)
    with pytest.raises(Exception, match="measure_flops: model must be a module"):
        ht.measure_flops("model", x)


def test_the_peak_table():
    from hookwrap.torch.throughput import lookup_peak

    assert lookup_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4e12
    assert lookup_peak("NVIDIA H100 PCIe", "float16") == 756e12
    assert lookup_peak("NVIDIA H100 NVL", "bfloat16") == 835.5e12
    assert lookup_peak("NVIDIA H200", "tf32") == 494.7e12
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "float32") == 19.5e12
    assert lookup_peak("NVIDIA L40S", "bfloat16") == 362.05e12
    assert lookup_peak("NVIDIA L4", "bfloat16") == 121e12
    assert lookup_peak("NVIDIA L40", "bfloat16") is None  # not an L4: not in the table
    assert lookup_peak("Tesla T4", "bfloat16") is None  # no bfloat16 on a T4
    assert lookup_peak("NVIDIA GeForce GTX 1080", "float32") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_peak_flops_without_cuda_is_none(ht):
    assert ht.peak_flops() is None and ht.peak_flops("cpu", torch.bfloat16) is None


# --- no host reads, resume, pickling ------------------------------------------------


def test_no_host_reads_on_the_tiny_loop(hw, ht):
    trainer = tiny_loop(hw)
    meter, memory = ht.Throughput(every=10, flops_per_sample=100.0, peak_flops=1e9), ht.MemoryMonitor(every=10)
    trainer.add_callback(meter)
    trainer.add_callback(memory)
    with ht.count_host_reads() as reads:
        trainer.fit(5)
    assert trainer.steps == 100 and reads.count == 0, reads
    assert [step for step, _ in meter.history] == list(range(10, 101, 10))
    assert all(m["samples_per_sec"] == 8 * m["steps_per_sec"] for _, m in meter.history)
    assert [step for step, _ in memory.history] == list(range(10, 101, 10))


def test_state_dict_resumes_the_step_count_and_history(hw, ht):
    clock = Clock()
    loop = make_loop(hw, tensors(), clock)
    meter = ht.Throughput(every=4, clock=clock)
    loop.add_callback(meter)
    loop.epoch()  # 6 steps: one window, two steps of the next
    state = meter.state_dict()
    assert state["step"] == 6 and [step for step, _ in state["history"]] == [4]
    resumed = ht.Throughput(every=4, clock=clock)
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    loop2 = make_loop(hw, tensors(), clock)
    loop2.add_callback(resumed)
    loop2.epoch()  # steps 7-12: the window opened on resume (7, 8) reports at 8, then 9-12
    assert [step for step, _ in resumed.history] == [4, 8, 12]
    # The window cut by the resume has 2 steps: its rates are still per second.
    assert resumed.history[1][1] == {"steps_per_sec": 4.0, "samples_per_sec": sum(SIZES[:2]) / 0.5}


def summed_ids(batch: Any) -> Any:
    return batch["input_ids"].sum()


def test_pickles_and_copies_with_what_it_has_queued(hw, ht):
    loop = make_loop(hw, [{"input_ids": torch.ones(2, 3)}] * 2, Clock())
    meter = ht.Throughput(every=2, tokens=summed_ids)  # a device value, queued
    memory = ht.MemoryMonitor(every=1)
    loop.add_callback(meter)
    loop.add_callback(memory)
    loop.epoch()
    for restored in (pickle.loads(pickle.dumps(meter)), copy.deepcopy(meter)):
        assert [step for step, _ in restored.history] == [2]
        metrics = restored.history[0][1]
        assert metrics["tokens_per_sec"] == pytest.approx(6 * metrics["steps_per_sec"])
    assert pickle.loads(pickle.dumps(memory)).history == memory.history


# --- bad input --------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    ({"every": 0}, r"Throughput: every must be a whole number >= 1, got 0"),
    ({"flops_per_sample": 10.0, "peak_flops": -1.0}, r"Throughput: peak_flops must be a number > 0"),
    ({"flops_per_sample": 10.0, "peak_flops": float("nan")}, r"Throughput: peak_flops must be a number > 0"),
    ({"flops_per_sample": 0}, r"Throughput: flops_per_sample must be a number > 0"),
    ({"peak_flops": 1e12}, r"Throughput: peak_flops= is used for MFU, which needs flops_per_sample="),
    ({"samples": "input_ids"}, r"Throughput: samples must be a function of the batch"),
    ({"samples": 0}, r"Throughput: samples must be a function of the batch"),
    ({"batch": None}, r"Throughput: with batch=None there is no batch"),
    ({"batch": None, "samples": 8, "tokens": "input_ids"}, r"Throughput: tokens= needs a batch"),
    ({"tokens": 3}, r"Throughput: tokens must be a function of the batch"),
    ({"batch": "not a name"}, r"Throughput: batch must be the name of the step join point's argument"),
    ({"clock": 1.0}, r"Throughput: clock must be a function returning seconds"),
    ({"logger": object()}, r"Throughput: logger must be a hookwrap.torch.MetricsLogger, an object with log_metrics\(metrics.*got <object object at .*> \(object\), which has no log_metrics method"),
    ({"sync": True, "device": "cpu"}, r"Throughput: sync=True synchronizes CUDA, but the device is cpu"),
    ({"device": "no such device"}, r"Throughput: device must be a torch.device"),
])
def test_bad_throughput_settings_fail_at_construction(hw, ht, kwargs, message):
    with pytest.raises(hw.HookError, match=message):
        ht.Throughput(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_mfu_without_a_peak_on_the_cpu_says_to_pass_one(hw, ht):
    with pytest.raises(hw.HookError, match=r"Throughput: MFU \(flops_per_sample=\) needs the device's peak "
                                           r"FLOP/s, and there is no table for 'cpu': pass peak_flops="):
        ht.Throughput(flops_per_sample=100.0)
    with pytest.raises(hw.HookError, match=r"Throughput\(device='cuda'\): CUDA is not available here"):
        ht.Throughput(device="cuda")


def test_a_batch_it_cannot_count_names_the_fix(hw, ht):
    loop = make_loop(hw, ["a string batch"], Clock())
    loop.add_callback(ht.Throughput())
    with pytest.raises(hw.HookError, match=r"Throughput: cannot count the samples of the batch at step 1 \(a "
                                           r"str\).* Pass samples= a function of the batch"):
        loop.epoch()
    loop = make_loop(hw, [{"input_ids": torch.ones(2, 2)}], Clock())
    loop.add_callback(ht.Throughput(tokens="attention_mask"))
    with pytest.raises(hw.HookError, match=r"has no tensor 'attention_mask' to count tokens from"):
        loop.epoch()
    loop = make_loop(hw, [torch.ones(2)], Clock())
    loop.add_callback(ht.Throughput(samples=lambda b: -1))
    with pytest.raises(hw.HookError, match=r"Throughput: the samples= function must return a whole number"):
        loop.epoch()


def test_a_misspelled_step_event_fails_when_attached(hw, ht):
    loop = make_loop(hw, [], Clock())
    with pytest.raises(hw.UnknownEventError, match=r"Did you mean 'step'"):
        loop.add_callback(ht.Throughput(step_event="stepp"))
    with pytest.raises(hw.UnknownEventError, match=r"Did you mean 'step'"):
        loop.add_callback(ht.MemoryMonitor(step_event="stepp"))


@pytest.mark.parametrize("kwargs, message", [
    ({"every": -1}, r"MemoryMonitor: every must be a whole number >= 1, got -1"),
    ({"reset_peak": 1}, r"MemoryMonitor: reset_peak must be True or False"),
    ({"logger": 3}, r"MemoryMonitor: logger must be a hookwrap.torch.MetricsLogger, an object with log_metrics\(metrics.*got 3 \(int\), which has no log_metrics method"),
    ({"logger": dict}, r"MemoryMonitor: logger must be .*got the class dict, not an instance"),
    ({"device": 3.5}, r"MemoryMonitor: device must be a torch.device"),
])
def test_bad_memory_settings_fail_at_construction(hw, ht, kwargs, message):
    with pytest.raises(hw.HookError, match=message):
        ht.MemoryMonitor(**kwargs)


# --- memory -----------------------------------------------------------------------


def test_memory_monitor_reports_rss_every_n_steps(hw, ht):
    log = Log()
    loop = make_loop(hw, tensors(), Clock())
    memory = ht.MemoryMonitor(every=3, logger=log, device="cpu")
    loop.add_callback(memory)
    loop.fit(1)
    assert [step for step, _ in memory.history] == [3, 6]
    for _, values in memory.history:
        assert set(values) == {"rss_mib", "peak_rss_mib"}
        assert 0 < values["rss_mib"] <= values["peak_rss_mib"]
    assert [(s, n) for s, n, _ in log.rows] == [(s, n) for s in (3, 6) for n in ("rss_mib", "peak_rss_mib")]
    state = memory.state_dict()
    again = ht.MemoryMonitor(every=3, device="cpu")
    again.load_state_dict(state)
    assert again.step == 6 and again.history == memory.history


def test_a_large_allocation_raises_rss(ht):
    memory = ht.MemoryMonitor(device="cpu")
    before = memory.measure()["rss_mib"]
    block = torch.ones(64 * 1024 * 1024, dtype=torch.float32)  # 256 MiB, written: resident
    after = memory.measure()["rss_mib"]
    assert after - before > 200, (before, after)
    del block


def test_rss_without_psutil_reads_proc(monkeypatch):
    import builtins
    import os

    from hookwrap.torch.memory import process_rss

    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc/self/statm on this system")
    with_psutil = process_rss()
    real_import = builtins.__import__

    def no_psutil(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "psutil":
            raise ImportError("no psutil")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    without = process_rss()
    assert with_psutil is not None and without is not None
    assert abs(without - with_psutil) < 64 * 1024 * 1024  # the same measure, moments apart


# --- a woven third-party trainer ----------------------------------------------------


@pytest.mark.third_party
def test_throughput_on_a_woven_ignite_trainer(hw, ht):
    import importlib

    engine_module = pytest.importorskip("ignite.engine", reason="needs the thirdparty extra (pytorch-ignite)")
    preset = importlib.import_module("hookwrap.integrations.ignite")
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)),
        batch_size=8)  # 4 batches of (x, y)
    model = torch.nn.Linear(4, 1)
    meter = ht.Throughput(every=4, flops_per_sample=ht.measure_flops(model, torch.randn(8, 4)) / 8,
                          peak_flops=1e12)
    reads = []
    with preset.weave():
        for callback in (None, meter):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            trainer = engine_module.create_supervised_trainer(model, optimizer, torch.nn.functional.mse_loss)
            if callback is not None:
                hw.add_callback(trainer, callback)
            with ht.count_host_reads() as counted:
                trainer.run(data, max_epochs=3)
            reads.append(counted.by_method)
    assert [step for step, _ in meter.history] == [4, 8, 12]
    for _, metrics in meter.history:
        assert metrics["samples_per_sec"] == 8 * metrics["steps_per_sec"]
        assert metrics["mfu"] == 16 * metrics["samples_per_sec"] / 1e12  # 2*4*1 forward + as much backward
    # ignite reads its loss each step (loss.item()), and more: the meter adds no read.
    assert reads[0] == reads[1] and reads[1]["item"] >= 12


# --- CUDA: run where it exists ---------------------------------------------------------


@cuda
def test_cuda_throughput_never_syncs_per_step(hw, ht):
    trainer = tiny_loop(hw, "cuda")
    meter = ht.Throughput(every=10, device="cuda", flops_per_sample=48.0, peak_flops=ht.peak_flops() or 1e12)
    memory = ht.MemoryMonitor(every=10, device="cuda")
    trainer.add_callback(meter)
    trainer.add_callback(memory)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any implicit sync in a step raises
    try:
        trainer.epoch(0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert [step for step, _ in meter.history] == [10, 20]
    assert all(m["mfu"] > 0 for _, m in meter.history)
    assert all(v["cuda_allocated_mib"] > 0 for _, v in memory.history)


@cuda
def test_cuda_throughput_with_one_sync_per_window(hw, ht):
    trainer = tiny_loop(hw, "cuda")
    meter = ht.Throughput(every=5, device="cuda", sync=True)
    trainer.add_callback(meter)
    trainer.epoch(0)
    assert [step for step, _ in meter.history] == [5, 10, 15, 20]


@cuda
def test_cuda_memory_follows_an_allocation_and_resets_its_peak(ht):
    memory = ht.MemoryMonitor(device="cuda", reset_peak=True)
    before = memory.report()
    block = torch.ones(64 * 1024 * 1024, device="cuda")  # 256 MiB
    during = memory.report()
    assert during["cuda_allocated_mib"] - before["cuda_allocated_mib"] >= 256
    assert during["cuda_peak_allocated_mib"] >= during["cuda_allocated_mib"]
    del block
    # The report above reset the peak to what was allocated then, the block included;
    # the next report resets it again with the block gone, so the one after has none of it.
    assert memory.report()["cuda_peak_allocated_mib"] == during["cuda_peak_allocated_mib"]
    after = memory.report()
    assert after["cuda_peak_allocated_mib"] <= during["cuda_peak_allocated_mib"] - 256


@pytest.mark.third_party
def test_throughput_on_a_woven_transformers_trainer(hw, ht, tmp_path):
    """HF's step join point is training_step(model, inputs): its batch is `inputs`,
    a mapping with input_ids (4 sequences of 16 tokens)."""
    import importlib

    pytest.importorskip("transformers", reason="needs the thirdparty extra (transformers)")
    from tests.integrations._tiny_hf import tiny_trainer

    preset = importlib.import_module("hookwrap.integrations.transformers")
    with preset.weave():
        trainer = tiny_trainer(tmp_path, steps=4)
        meter = ht.Throughput(every=2, batch="inputs")
        hw.add_callback(trainer, meter)
        trainer.train()
    assert [step for step, _ in meter.history] == [2, 4]
    for _, metrics in meter.history:
        assert metrics["samples_per_sec"] == pytest.approx(4 * metrics["steps_per_sec"])
        assert metrics["tokens_per_sec"] == pytest.approx(16 * metrics["samples_per_sec"])
