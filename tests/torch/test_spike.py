"""SpikeDetection: the same spikes at the same steps as Lightning's own
SpikeDetection on the same losses; on a real loop with no host read per step, and
a spike at the last step still stops the run (nothing lost)."""

from __future__ import annotations

import io
import json
import math
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice, torchmetrics' NaN notice


def make_loop(hw: Any, losses: list[float], tensors: bool = True, epochs_of: int = 0) -> Any:
    """A loop whose step trains a real model on a loss made equal to the scripted value."""

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(2, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
            self.stop_reason: str | None = None
            self.steps = 0

        @hw.hookable
        def fit(self) -> None:
            try:
                if epochs_of:
                    for index in range(0, len(losses), epochs_of):
                        self.epoch(losses[index:index + epochs_of])
                else:
                    for value in losses:
                        self.step(value)
            except hw.StopTraining as stop:
                self.stop_reason = str(stop)

        @hw.hookable
        def epoch(self, values: list[float]) -> None:
            for value in values:
                self.step(value)

        @hw.hookable
        def step(self, value: float) -> None:
            self.steps += 1
            out = self.model(torch.ones(4, 2)).mean()
            loss = self.loss(out - out.detach() + value if tensors else value)
            if tensors:
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad()

        @hw.hookable
        def loss(self, value: Any) -> Any:
            return value

    return Loop()


def lightning_spikes(losses: list[float], tmp_path: Any, **settings: Any) -> list[int]:
    """Lightning's SpikeDetection on the same losses (its batch_idx 0-based): the steps
    (1-based) where it raised, going on after each as SpikeDetection(action='log')."""
    from lightning.fabric import Fabric
    from lightning.fabric.utilities.spike import SpikeDetection, TrainingSpikeException

    fabric = Fabric(accelerator="cpu", devices=1)
    detector = SpikeDetection(exclude_batches_path=str(tmp_path / "lightning.json"), **settings)
    spikes = []
    for index, value in enumerate(losses):
        try:
            detector.on_train_batch_end(fabric, torch.tensor(value), None, index)
        except TrainingSpikeException:
            spikes.append(index + 1)
    return spikes


def smooth(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [float(torch.tensor(2.0 * 0.97 ** i + rng.uniform(-0.05, 0.05), dtype=torch.float32)) for i in range(n)]


SEQUENCES = {
    "one-spike": smooth(30, 0)[:12] + [9.0] + smooth(30, 0)[12:],
    "spikes-and-nan": [*smooth(10, 1), 5.0, *smooth(5, 2), math.nan, 1.0, 0.9, math.inf, 0.8, 4.0, 0.7],
    "noisy": [float(torch.tensor(random.Random(3).gauss(1.0, 0.4) + (3 if i % 9 == 8 else 0), dtype=torch.float32))
              for i in range(60)],
}
SETTINGS = [
    {},
    {"window": 3, "warmup": 5, "rtol": 0.5},
    {"atol": 1.0, "rtol": None},
    {"atol": 0.2, "rtol": 0.3, "finite_only": False},
    {"mode": "max", "rtol": 0.2},
    {"atol": None, "rtol": None, "window": 1, "warmup": 0},
]


@pytest.mark.third_party  # Lightning's own SpikeDetection: the thirdparty extra
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "defaults")
@pytest.mark.parametrize("name", list(SEQUENCES))
def test_the_same_spikes_at_the_same_steps_as_lightning(hw, ht, tmp_path, name, settings):
    pytest.importorskip("lightning.fabric", reason="needs the thirdparty extra (lightning)")
    losses = SEQUENCES[name]
    expected = lightning_spikes(losses, tmp_path, **settings)
    loop = make_loop(hw, losses)
    detector = ht.SpikeDetection(action="log", exclude_batches_path=tmp_path / "ours", **settings)
    loop.add_callback(detector)
    loop.fit()
    assert [step for step, _, _ in detector.spikes] == expected
    assert detector.bad_batches == [s for step in expected for s in (step - 1, step)]
    if expected:  # the same file Lightning writes (its indices are 0-based: ours one more)
        ours = json.loads((tmp_path / "ours" / "skip_batches.json").read_text())
        theirs = json.loads((tmp_path / "lightning.json").read_text())
        assert ours == [i + 1 for i in theirs]
    if name != "noisy" and not settings:
        assert expected  # the sequences do spike


def test_a_spike_raises_as_lightning_does_naming_its_step_with_no_host_read_per_step(hw, ht, caplog):
    losses = SEQUENCES["one-spike"] + smooth(40, 4)
    loop = make_loop(hw, losses)
    loop.add_callback(ht.SpikeDetection())  # check_every=20
    with ht.count_host_reads() as reads, caplog.at_level("INFO", logger="hookwrap"), \
            pytest.raises(ht.TrainingSpikeError, match="spiked at step 13: 9 against a running mean") as raised:
        loop.fit()
    assert raised.value.step == 13 and raised.value.bad_steps == [12, 13]
    assert loop.steps == 20  # decided as step 21 starts (after check_every losses were queued), before it runs
    assert reads.count == 1, reads  # one read-back of 20 losses
    assert "Stopping the run (action='raise')" in caplog.text


def test_a_spike_at_the_last_step_still_stops_the_run_at_its_end(hw, ht):
    losses = smooth(15, 5) + [20.0]
    loop = make_loop(hw, losses)
    detector = ht.SpikeDetection()
    loop.add_callback(detector)
    with ht.count_host_reads() as reads, pytest.raises(ht.TrainingSpikeError, match="spiked at step 16"):
        loop.fit()
    assert loop.steps == 16 and detector.bad_batches == [15, 16] and reads.count == 1


def test_with_action_stop_a_spike_found_as_the_run_ended_is_a_warning(hw, ht, caplog):
    loop = make_loop(hw, smooth(15, 5) + [20.0])
    detector = ht.SpikeDetection(action="stop")
    loop.add_callback(detector)
    with caplog.at_level("INFO", logger="hookwrap"):
        loop.fit()  # returns: the run is over, nothing to stop
    assert loop.stop_reason is None and detector.bad_batches == [15, 16]
    assert [r.levelname for r in caplog.records if "spiked at step 16" in r.getMessage()] == ["WARNING"]


def test_a_spike_is_read_back_at_the_end_of_each_epoch(hw, ht):
    losses = smooth(30, 6)
    losses[6] = 30.0
    loop = make_loop(hw, losses, epochs_of=10)
    loop.add_callback(ht.SpikeDetection(action="stop"))
    loop.fit()
    assert loop.steps == 10 and "step 7" in (loop.stop_reason or "")


def test_python_numbers_are_decided_at_once(hw, ht):
    losses = smooth(10, 7) + [50.0] + smooth(10, 8)
    loop = make_loop(hw, losses, tensors=False)
    loop.add_callback(ht.SpikeDetection())
    with pytest.raises(ht.TrainingSpikeError, match="step 11"):
        loop.fit()
    assert loop.steps == 11


def test_an_error_leaving_the_run_gets_the_spike_as_a_note(hw, ht):
    losses = smooth(5, 9) + [40.0] + smooth(3, 9)
    loop = make_loop(hw, losses)
    loop.add_callback(ht.SpikeDetection())

    def fail(self: Any) -> None:
        if self.steps == 8:
            raise OSError("disk full")

    loop.after("step", fail)
    with pytest.raises(OSError, match="disk full") as raised:
        loop.fit()
    assert any("spiked at step 6" in note for note in raised.value.__notes__)


def test_state_round_trips_and_a_resume_decides_as_the_whole_run(hw, ht):
    losses = SEQUENCES["noisy"]
    whole = ht.SpikeDetection(action="log", window=4, rtol=0.5)
    loop = make_loop(hw, losses)
    loop.add_callback(whole)
    loop.fit()

    first = ht.SpikeDetection(action="log", window=4, rtol=0.5)
    loop = make_loop(hw, losses[:30])
    loop.add_callback(first)
    loop.fit()
    buffer = io.BytesIO()
    torch.save(hw.callback_state(loop), buffer)
    buffer.seek(0)
    second = ht.SpikeDetection(action="log", window=4, rtol=0.5)
    resumed = make_loop(hw, losses[30:])
    resumed.add_callback(second)
    hw.load_callback_state(resumed, torch.load(buffer, weights_only=True))
    resumed.fit()
    assert second.bad_batches == whole.bad_batches and second.step == len(losses)
    assert second.running_mean() == whole.running_mean()


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "best"}, "mode must be 'min' or 'max'"),
    ({"window": 0}, "window must be a whole number >= 1"),
    ({"warmup": -1}, "warmup must be a whole number >= 0"),
    ({"atol": math.nan}, "atol must be a finite number or None"),
    ({"rtol": "2"}, "rtol must be a finite number or None"),
    ({"finite_only": 1}, "finite_only must be True or False"),
    ({"action": "warn"}, "action must be one of 'raise', 'stop', 'log'"),
    ({"event": ""}, "event must be a join point name"),
    ({"exclude_batches_path": 3}, "exclude_batches_path must be a path or None"),
    ({"check_every": 0}, "check_every must be a whole number >= 1"),
])
def test_spike_detection_refuses_bad_settings(hw, ht, kwargs, message):
    with pytest.raises(hw.HookError, match=message):
        ht.SpikeDetection(**kwargs)


def test_spike_detection_refuses_a_loss_that_is_not_one_number(hw, ht):
    @hw.hookable
    def loss(value: Any) -> Any:
        return value

    detector = ht.SpikeDetection(event="loss")
    handle = hw.add_callback(loss, detector)
    with pytest.raises(hw.HookError, match=r"must be one number, got a tensor of shape \(2,\)"):
        loss(torch.ones(2))
    with pytest.raises(hw.HookError, match="must be a tensor of one element or a number, got str"):
        loss("1.0")
    assert detector.pending() == ""  # nothing refused is left waiting
    handle.remove()
    with pytest.raises(hw.UnknownEventError, match="Did you mean 'loss'"):
        make_loop(hw, []).add_callback(ht.SpikeDetection(event="los"))
