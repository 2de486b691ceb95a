"""Profiler: named ranges around the loop's join points, and torch.profiler over a
window of steps, written as a Chrome trace (CPU, a tiny model, both implementations)."""

from __future__ import annotations

import collections
import json
import os
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")

STEPS = 6
RANGES = ("hookwrap:step", "hookwrap:loss", "hookwrap:backward", "hookwrap:optimizer_step")


def make_trainer(hw: Any) -> Any:
    class Trainer(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(4, 2)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            gen = torch.Generator().manual_seed(1)
            self.batches = [(torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen))
                            for _ in range(STEPS)]
            self.losses: list[float] = []

        @hw.hookable
        def fit(self) -> None:
            for x, y in self.batches:
                self.step(x, y)

        @hw.hookable
        def step(self, x: Any, y: Any) -> None:
            loss = self.loss(self.model(x), y)
            self.backward(loss)
            self.optimizer_step()
            self.losses.append(loss.item())

        @hw.hookable
        def loss(self, out: Any, y: Any) -> Any:
            return torch.nn.functional.mse_loss(out, y)

        @hw.hookable
        def backward(self, loss: Any) -> None:
            loss.backward()

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad()

    return Trainer()


def range_counts(path: str) -> collections.Counter[str]:
    with open(path) as f:
        trace = json.load(f)
    # the CPU-side ranges ("gpu_user_annotation" copies of them appear too on CUDA)
    return collections.Counter(e["name"] for e in trace["traceEvents"]
                               if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("hookwrap:"))


def test_profiler_writes_the_window_with_the_named_ranges(hw, ht, tmp_path):
    plain = make_trainer(hw)
    plain.fit()

    trainer = make_trainer(hw)
    profiler = ht.Profiler(dir=tmp_path / "prof", wait=1, warmup=1, active=3)
    trainer.add_callback(profiler)
    trainer.fit()

    assert trainer.losses == plain.losses  # the loop's numbers are unchanged
    assert profiler.traces == [str(tmp_path / "prof" / "trace_rank0.json")]
    # steps 1 (wait) and 2 (warmup) are not in the trace, 3-5 are, 6 runs after the stop
    assert range_counts(profiler.traces[0]) == {name: 3 for name in RANGES}
    assert not torch._C._autograd._profiler_enabled()  # stopped


def test_profiler_writes_a_trace_tensorboard_reads(hw, ht, tmp_path):
    """trace_format="tensorboard": the file torch's tensorboard_trace_handler names,
    in the log folder, with the same ranges."""
    trainer = make_trainer(hw)
    profiler = ht.Profiler(dir=tmp_path / "tb", wait=1, warmup=1, active=3, trace_format="tensorboard")
    trainer.add_callback(profiler)
    trainer.fit()
    assert len(profiler.traces) == 1
    path = profiler.traces[0]
    assert os.path.dirname(path) == str(tmp_path / "tb")
    assert re.fullmatch(r"rank0\.\d+\.pt\.trace\.json", os.path.basename(path))
    assert os.listdir(tmp_path / "tb") == [os.path.basename(path)]
    assert range_counts(path) == {name: 3 for name in RANGES}


def test_profiler_names_its_own_tensorboard_trace_beside_another_rank_s(hw, ht, tmp_path, monkeypatch):
    """Ranks may share the log folder: the trace is the file of this rank's worker name."""
    handler = torch.profiler.tensorboard_trace_handler

    def and_another_rank(folder, worker_name):
        write = handler(folder, worker_name=worker_name)

        def both(prof):
            (tmp_path / "rank1.123.pt.trace.json").write_text("{}")
            write(prof)
            (tmp_path / "rank9.999.pt.trace.json").write_text("{}")

        return both

    monkeypatch.setattr(torch.profiler, "tensorboard_trace_handler", and_another_rank)
    trainer = make_trainer(hw)
    profiler = ht.Profiler(dir=tmp_path, wait=0, warmup=1, active=1, trace_format="tensorboard")
    trainer.add_callback(profiler)
    trainer.fit()
    assert len(profiler.traces) == 1 and os.path.basename(profiler.traces[0]).startswith("rank0.")
    assert range_counts(profiler.traces[0])["hookwrap:loss"] == 1


def test_profiler_writes_what_it_has_when_fit_ends_inside_the_window(hw, ht, tmp_path):
    trainer = make_trainer(hw)
    profiler = ht.Profiler(events="loss", dir=tmp_path, wait=0, warmup=1, active=10)
    trainer.add_callback(profiler)
    trainer.fit()
    assert range_counts(profiler.traces[0]) == {"hookwrap:loss": STEPS - 1}
    assert not torch._C._autograd._profiler_enabled()


def test_profiler_on_a_function_join_point(hw, ht, tmp_path):
    @hw.hookable
    def step(x: Any) -> Any:
        return x * 2

    profiler = ht.Profiler(events="step", dir=tmp_path, wait=0, warmup=1, active=2)
    hw.add_callback(step, profiler)
    assert [step(torch.tensor(float(i))).item() for i in range(4)] == [0.0, 2.0, 4.0, 6.0]
    assert range_counts(profiler.traces[0]) == {"hookwrap:step": 2}


@pytest.mark.parametrize("kwargs, message", [
    ({"active": 0}, "active must be a whole number >= 1"),
    ({"active": -2}, "active must be a whole number >= 1"),
    ({"active": 1.5}, "active must be a whole number >= 1"),
    ({"wait": -1}, "wait must be a whole number >= 0"),
    ({"warmup": True}, "warmup must be a whole number >= 0"),
    ({"events": ("step", 3)}, "events must be a join point name or a non-empty tuple"),
    ({"events": ()}, "events must be a join point name or a non-empty tuple"),
    ({"dir": None}, "dir must be a folder path"),
    ({"step_event": None}, "step_event must be a join point name"),
    ({"trace_format": "perfetto"}, "trace_format must be one of 'chrome', 'tensorboard', got 'perfetto'"),
])
def test_profiler_refuses_bad_input(hw, ht, kwargs, message):
    with pytest.raises(hw.HookError, match=message):
        ht.Profiler(**kwargs)


def test_profiler_refuses_an_unknown_event_when_attached(hw, ht, tmp_path):
    with pytest.raises(hw.UnknownEventError, match="Did you mean 'loss'"):
        make_trainer(hw).add_callback(ht.Profiler(events=("step", "losss"), dir=tmp_path))
    with pytest.raises(hw.UnknownEventError, match="Did you mean 'step'"):
        make_trainer(hw).add_callback(ht.Profiler(step_event="stepp", dir=tmp_path))
