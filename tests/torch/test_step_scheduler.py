"""``StepScheduler``: an LR scheduler stepped after each update (or epoch) of a loop
that never calls it, with the rates of the loop that does (Lightning's own is in
tests/integrations/test_lightning.py)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")


def _warmup_then_cosine(optimizer: Any) -> Any:
    lr = torch.optim.lr_scheduler
    return lr.SequentialLR(optimizer, [lr.LinearLR(optimizer, 0.25, total_iters=3),
                                       lr.CosineAnnealingLR(optimizer, T_max=6)], milestones=[3])


def _loop(hw: Any) -> Any:
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(2, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1.0)
            self.scheduler = _warmup_then_cosine(self.optimizer)
            self.rates: list[float] = []

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad()

        @hw.hookable
        def epoch(self, steps: int) -> None:
            for _ in range(steps):
                self.model(torch.ones(1, 2)).sum().backward()
                self.optimizer_step()
                self.rates.append(self.optimizer.param_groups[0]["lr"])

    return Loop()


def _by_hand(steps: int, epochs: int = 1, interval: str = "step", frequency: int = 1) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = _warmup_then_cosine(optimizer)
    rates, done = [], 0
    for _ in range(epochs):
        for _ in range(steps):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if interval == "step" and done % frequency == 0:
                scheduler.step()
            rates.append(optimizer.param_groups[0]["lr"])
        if interval == "epoch":
            scheduler.step()
    return rates


@pytest.mark.parametrize(("interval", "frequency"), [("step", 1), ("step", 2), ("epoch", 1)])
def test_the_rates_are_those_of_the_loop_that_steps_its_scheduler(hw, ht, interval, frequency):
    loop = _loop(hw)
    stepper = ht.StepScheduler(interval=interval, frequency=frequency)
    loop.add_callback(stepper)
    for _ in range(3):
        loop.epoch(4)
    assert loop.rates == _by_hand(4, epochs=3, interval=interval, frequency=frequency)
    assert stepper.stepped == (12 // frequency if interval == "step" else 3)
    assert len(set(loop.rates)) >= 3  # the rates change: the test can tell a missed step


def test_its_count_resumes_with_the_run(hw, ht):
    loop = _loop(hw)
    stepper = ht.StepScheduler(frequency=3)
    loop.add_callback(stepper)
    loop.epoch(4)
    again = ht.StepScheduler(frequency=3)
    again.load_state_dict(stepper.state_dict())
    assert (again.calls, again.stepped) == (1, 1)  # one update since its last scheduler step


def test_bad_settings_and_a_plateau_scheduler_are_refused_naming_the_fix(hw, ht):
    for kwargs, message in ((dict(interval="batch"), r"interval must be 'step'"),
                            (dict(frequency=0), r"frequency"), (dict(scheduler=None), r"scheduler must be")):
        with pytest.raises(hw.SettingError, match=message):
            ht.StepScheduler(**kwargs)
    loop = _loop(hw)
    loop.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(loop.optimizer)
    loop.add_callback(ht.StepScheduler())
    with pytest.raises(hw.SettingError, match=r"ReduceLROnPlateau steps on a metric.*'monitor': 'val_loss'"):
        loop.epoch(1)
    loop = _loop(hw)
    loop.add_callback(ht.StepScheduler(scheduler="optimizer"))
    with pytest.raises(hw.HookError, match=r"scheduler='optimizer' is a SGD, not an LR scheduler"):
        loop.epoch(1)
