"""SkipBadSteps: a run with injected bad batches (a NaN input, an outlier batch whose
loss spikes) ends with exactly (torch.equal) the weights of the same run with those
batches left out, as if they never came; the run stops after too many in a row."""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")


def _batches(n: int = 12, bad: dict[int, str] | None = None) -> list[tuple[Any, Any]]:
    """n batches (1-based steps); ``bad``: step -> "nan" (a NaN input) or "spike"
    (inputs 1000 times larger: a finite loss far above the others)."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for step in range(1, n + 1):
        x, y = torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g)
        kind = (bad or {}).get(step)
        if kind == "nan":
            x = x.clone()
            x[0, 0] = float("nan")
        elif kind == "spike":
            x = x * 1000
        batches.append((x, y))
    return batches


def _loop(hw: Any) -> Any:
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(3, 2)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

        @hw.hookable
        def step(self, x: Any, y: Any) -> Any:
            loss = self.loss(self.model(x), y)
            loss.backward()
            self.optimizer_step()
            return loss.detach()

        @hw.hookable
        def loss(self, out: Any, y: Any) -> Any:
            return torch.nn.functional.mse_loss(out, y)

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    return Loop()


def _by_hand(batches: list[tuple[Any, Any]], accumulate: int = 1) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for i, (x, y) in enumerate(batches, 1):
        (torch.nn.functional.mse_loss(model(x), y) / accumulate).backward()
        if i % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model.state_dict()


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_bad_batches_are_skipped_as_if_they_never_came(hw, ht, tmp_path, caplog):
    bad = {4: "nan", 7: "spike", 9: "nan"}
    loop = _loop(hw)
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    skip = ht.SkipBadSteps(spike_rtol=5.0, logger=logger)
    hw.add_callback(loop, skip)
    hw.add_callback(loop, logger)
    with caplog.at_level(logging.WARNING, logger="hookwrap"):
        for x, y in _batches(bad=bad):
            loop.step(x, y)
    logger.close()
    _same(loop.model.state_dict(), _by_hand([b for i, b in enumerate(_batches(), 1) if i not in bad]))
    assert [step for step, _ in skip.skipped] == [4, 7, 9]
    assert skip.skipped[0][1] == "a loss is nan" and "spiked against the mean" in skip.skipped[1][1]
    assert skip.consecutive == 0  # the steps after each were good
    rows = [line.split(",") for line in (tmp_path / "m.csv").read_text().splitlines()[1:]]
    assert [(s, v) for s, n, v in rows if n == "skipped_steps"] == [("4", "1.0"), ("7", "2.0"), ("9", "3.0")]
    assert "): skipped the update of step 7: its loss 213665 spiked against the mean" in caplog.text
    # The same run without SkipBadSteps: its NaN reaches the weights.
    plain = _loop(hw)
    for x, y in _batches(bad=bad):
        plain.step(x, y)
    assert not torch.isfinite(plain.model.weight).all()


def test_a_nan_gradient_with_a_finite_loss_is_skipped(hw, ht):
    """The loss read is finite, the gradients are not (an inf in a weight's gradient)."""
    loop = _loop(hw)
    skip = ht.SkipBadSteps(loss_event=None)
    hw.add_callback(loop, skip)
    batches = _batches()
    for i, (x, y) in enumerate(batches, 1):
        if i == 3:
            hook = loop.model.weight.register_hook(lambda g: g * float("inf"))
        loop.step(x, y)
        if i == 3:
            hook.remove()
    assert skip.skipped == [(3, "the gradient norm is inf")] or skip.skipped[0][1].startswith("the gradient norm is")
    _same(loop.model.state_dict(), _by_hand([b for i, b in enumerate(batches, 1) if i != 3]))


def test_too_many_in_a_row_stop_the_run_naming_the_steps(hw, ht):
    loop = _loop(hw)
    hw.add_callback(loop, ht.SkipBadSteps(max_consecutive=3))
    with pytest.raises(hw.StopTraining, match=r"3 updates in a row were skipped \(steps 5, 6, 7"):
        for x, y in _batches(bad={5: "nan", 6: "nan", 7: "nan"}):
            loop.step(x, y)


def test_across_a_resume_it_goes_on_as_the_run_that_never_stopped(hw, ht):
    """Stopped after step 6 (one skip in a row at 6, a spike window of good steps) and
    resumed from its state and the weights, it decides as the uninterrupted run: the
    same skips, the same stop after three in a row (its count went on across the
    resume), the same weights."""
    bad = {3: "spike", 6: "nan", 7: "nan", 8: "nan"}
    settings = dict(spike_rtol=5.0, max_consecutive=3)

    def run(loop: Any, skip: Any, batches: list[tuple[Any, Any]]) -> str:
        try:
            for x, y in batches:
                loop.step(x, y)
        except hw.StopTraining as stop:
            return str(stop)
        return ""

    batches = _batches(bad=bad)
    straight, straight_skip = _loop(hw), ht.SkipBadSteps(**settings)
    hw.add_callback(straight, straight_skip)
    straight_stop = run(straight, straight_skip, batches)
    assert "steps 6, 7, 8" in straight_stop

    first, first_skip = _loop(hw), ht.SkipBadSteps(**settings)
    hw.add_callback(first, first_skip)
    assert run(first, first_skip, batches[:6]) == "" and first_skip.consecutive == 1
    resumed, resumed_skip = _loop(hw), ht.SkipBadSteps(**settings)
    hw.add_callback(resumed, resumed_skip)
    resumed.model.load_state_dict(first.model.state_dict())
    resumed.optimizer.load_state_dict(first.optimizer.state_dict())
    hw.load_callback_state(resumed, hw.callback_state(first))
    assert run(resumed, resumed_skip, batches[6:]) == straight_stop
    assert resumed_skip.skipped == straight_skip.skipped
    _same(resumed.model.state_dict(), straight.model.state_dict())

def test_with_grad_accumulation_a_bad_micro_batch_skips_its_whole_update(hw, ht):
    """GradAccumulation(2), then SkipBadSteps: the update whose window held the NaN
    batch (batches 5 and 6) is skipped, its good half too, as if both never came."""
    loop = _loop(hw)
    hw.add_callback(loop, ht.GradAccumulation(2))
    skip = ht.SkipBadSteps()
    hw.add_callback(loop, skip)
    for x, y in _batches(bad={5: "nan"}):
        loop.step(x, y)
    assert [why for _, why in skip.skipped] == ["a loss is nan"]
    _same(loop.model.state_dict(), _by_hand([b for i, b in enumerate(_batches(), 1) if i not in (5, 6)], 2))


def test_on_the_optimizers_own_step(hw, ht):
    """weave_optimizers (hookwrap run --preset torch_optim): the optimizer's step is
    the event, the optimizer the hooked object; the loss a function woven."""
    from hookwrap.integrations.torch_optim import weave_optimizers

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with weave_optimizers(), hw.weave(torch.nn.functional, loss="mse_loss"):
        skip = ht.SkipBadSteps(event="step")
        with hw.register_global_callback(skip):
            for x, y in _batches(bad={2: "nan", 8: "nan"}):
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    assert [step for step, _ in skip.skipped] == [2, 8]
    _same(model.state_dict(), _by_hand([b for i, b in enumerate(_batches(), 1) if i not in (2, 8)]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(loss_event=None, check_grad_norm=False), "nothing is checked"),
    (dict(spike_rtol=-1), "spike_rtol must be a finite number >= 0"),
    (dict(loss_event=None, spike_atol=1.0), "loss_event=None reads no loss"),
    (dict(mode="minimum"), "mode must be 'min'"),
    (dict(max_consecutive=0), "max_consecutive"),
])
def test_bad_settings_are_refused_naming_the_fix(hw, ht, kwargs, message):
    with pytest.raises(hw.HookError, match=message):
        ht.SkipBadSteps(**kwargs)


def test_rollback_undoes_the_updates_since_its_last_copy_and_goes_on(hw, ht):
    """Copies every 4 good updates (after steps 1 and 5); a NaN at step 9 rolls the
    model and the optimizer (SGD with momentum) back to step 5's: the run ends with the
    weights of batches 1-5 then 10-12, exactly (SkipBadSteps would keep 6-8)."""
    loop = _loop(hw)
    rollback = ht.Rollback(every=4)
    hw.add_callback(loop, rollback)
    batches = _batches(bad={9: "nan"})
    for x, y in batches:
        loop.step(x, y)
    assert rollback.rolled_back == [(9, 5, "a loss is nan")] and rollback.skipped == [(9, "a loss is nan")]
    _same(loop.model.state_dict(), _by_hand([b for i, b in enumerate(_batches(), 1) if i <= 5 or i >= 10]))


def test_rollback_stops_the_run_after_max_rollbacks(hw, ht):
    loop = _loop(hw)
    hw.add_callback(loop, ht.Rollback(every=2, max_rollbacks=2))
    with pytest.raises(hw.StopTraining, match=r"2 rollbacks \(steps 4, 8; the last: a loss is nan\)"):
        for x, y in _batches(bad={4: "nan", 8: "nan"}):
            loop.step(x, y)
    with pytest.raises(hw.SettingError, match=r"Rollback: every must be"):
        ht.Rollback(every=0)


def test_rollback_keeps_the_learning_rate_the_schedule_has_reached(hw, ht):
    """The optimizer's state goes back, not its settings: after a rollback at step 6 an
    ExponentialLR stepped after every update goes on from its rate of then."""
    loop = _loop(hw)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(loop.optimizer, gamma=0.5)
    loop.after("optimizer_step", lambda self: scheduler.step())
    hw.add_callback(loop, ht.Rollback(every=4))
    rates = []
    for x, y in _batches(n=8, bad={6: "nan"}):
        loop.step(x, y)
        rates.append(loop.optimizer.param_groups[0]["lr"])
    assert rates == [0.05 * 0.5 ** k for k in range(1, 9)]
