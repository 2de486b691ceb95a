"""TimeLimit: the run stops once its time budget is spent, after the step (or epoch)
that spent it, as Lightning's Timer(duration=...) does; driven by an injected clock
(no sleeping), and one real short run that stops; the budget resumes from
callback_state."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice

STEP_SECONDS = 10.0


class Clock:
    """A clock the loop moves: each step takes STEP_SECONDS."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_loop(hw: Any, clock: Clock | None = None, epochs: int = 4, steps_per_epoch: int = 3,
              with_fit: bool = True) -> Any:
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(4, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
            self.steps = 0
            self.epochs_done = 0
            self.stop_reason: str | None = None

        def train(self) -> None:
            try:
                for _ in range(epochs):
                    self.epoch()
            except hw.StopTraining as stop:
                self.stop_reason = str(stop)

        @hw.hookable
        def epoch(self) -> None:
            for _ in range(steps_per_epoch):
                self.step(torch.randn(8, 4))
            self.epochs_done += 1

        @hw.hookable
        def step(self, batch: Any) -> None:
            loss = self.model(batch).pow(2).mean()
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.steps += 1
            if clock is not None:
                clock.now += STEP_SECONDS

    if with_fit:
        class WithFit(Loop):
            @hw.hookable
            def fit(self) -> None:
                self.train()

        return WithFit()
    return Loop()


@pytest.mark.parametrize("duration", [35, 35.0, timedelta(seconds=35), {"seconds": 35}, "00:00:00:35"],
                         ids=["int", "float", "timedelta", "dict", "DD:HH:MM:SS"])
def test_stops_after_the_step_that_spent_the_budget(hw, ht, duration, caplog):
    clock = Clock()
    loop = make_loop(hw, clock)
    limit = ht.TimeLimit(duration, clock=clock)
    loop.add_callback(limit)
    with caplog.at_level("INFO", logger="hookwrap"):
        loop.fit()
    assert loop.steps == 4 and limit.stopped_at == 40.0  # 30 s < 35 s after step 3: one more
    assert "TimeLimit: the time limit of 0:00:35 is reached (40.0 s trained)" in (loop.stop_reason or "")
    assert "TimeLimit: the time limit of 0:00:35 is reached" in caplog.text
    assert limit.time_elapsed() == 40.0 and limit.time_remaining() == -5.0


def test_interval_epoch_lets_the_epoch_finish(hw, ht):
    clock = Clock()
    loop = make_loop(hw, clock)
    loop.add_callback(ht.TimeLimit(35, interval="epoch", clock=clock))
    loop.fit()
    assert loop.steps == 6 and loop.epochs_done == 2  # 30 s after epoch 1, 60 s after epoch 2


def test_the_budget_continues_from_callback_state(hw, ht):
    clock = Clock()
    # Three steps, then saved (as a checkpoint would be).
    limit = ht.TimeLimit(100, clock=clock)
    loop = make_loop(hw, clock, epochs=1)
    loop.add_callback(limit)
    loop.fit()
    assert limit.time_elapsed() == 30.0
    buffer = io.BytesIO()
    torch.save(hw.callback_state(loop), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert saved == {"TimeLimit": {"time_elapsed": 30.0}}

    clock.now += 5000.0  # time between the runs does not count
    resumed = make_loop(hw, clock)
    again = ht.TimeLimit(100, clock=clock)
    resumed.add_callback(again)
    hw.load_callback_state(resumed, saved)
    resumed.fit()
    assert resumed.steps == 7 and again.stopped_at == 100.0  # 30 s + 7 steps of 10 s


def test_a_resume_with_the_budget_spent_stops_before_its_first_step(hw, ht):
    clock = Clock()
    loop = make_loop(hw, clock)
    limit = ht.TimeLimit(30, clock=clock)
    loop.add_callback(limit)
    limit.load_state_dict({"time_elapsed": 30.0})
    loop.fit()
    assert loop.steps == 0 and loop.stop_reason is not None


def test_time_outside_fit_is_not_counted_and_fits_add_up(hw, ht):
    clock = Clock()
    loop = make_loop(hw, clock, epochs=1)  # 3 steps a fit
    limit = ht.TimeLimit(55, clock=clock)
    loop.add_callback(limit)
    loop.fit()
    clock.now += 1000.0
    assert limit.time_elapsed() == 30.0
    loop.fit()
    assert loop.steps == 6 and limit.stopped_at == 60.0


def test_a_loop_without_fit_counts_from_its_first_step(hw, ht):
    clock = Clock()
    loop = make_loop(hw, clock, with_fit=False)
    clock.now += 500.0  # before training: not counted
    limit = ht.TimeLimit(25, clock=clock)
    loop.add_callback(limit)
    loop.train()
    assert loop.steps == 3 and limit.stopped_at == 30.0


def test_a_real_short_run_stops(hw, ht):
    loop = make_loop(hw, epochs=100_000, steps_per_epoch=10)
    limit = ht.TimeLimit(0.05)  # time.monotonic
    loop.add_callback(limit)
    loop.fit()
    assert loop.stop_reason is not None and loop.steps < 1_000_000
    assert limit.stopped_at is not None and limit.stopped_at >= 0.05


@pytest.mark.parametrize("kwargs, message", [
    ({"duration": 0}, "duration must be a time > 0"),
    ({"duration": -1.0}, "duration must be a time > 0"),
    ({"duration": "12:00:00"}, "duration must be a time > 0"),
    ({"duration": {"hourz": 1}}, "duration must be a time > 0"),
    ({"duration": None}, "duration must be a time > 0"),
    ({"duration": True}, "duration must be a time > 0"),
    ({"duration": float("inf")}, "duration must be a time > 0"),
    ({"duration": 10, "interval": "batch"}, "interval must be 'step' or 'epoch'"),
    ({"duration": 10, "clock": 3}, "clock must be a function returning seconds"),
])
def test_time_limit_refuses_bad_settings(hw, ht, kwargs, message):
    with pytest.raises(hw.HookError, match=message):
        ht.TimeLimit(**kwargs)


def test_time_limit_refuses_a_target_it_could_not_check_on(hw, ht):
    class OnlyFit(hw.Hookable):
        @hw.hookable
        def fit(self) -> None:
            pass

    with pytest.raises(hw.HookError, match=r"no step_event join point \('step'\).*interval='epoch'"):
        OnlyFit().add_callback(ht.TimeLimit(10))
    with pytest.raises(hw.UnknownEventError, match="Did you mean 'step'"):
        make_loop(hw).add_callback(ht.TimeLimit(10, step_event="stepp"))
