"""hookwrap demo's cost per step: the interleaved timing, its robust statistic and
the "too noisy" verdict (hookwrap._bench.paired), fed synthetic samples (no wall
clock), and the step written by hand that hookwrap's own cost is measured against."""

from __future__ import annotations

import importlib
import io
import math
import random
import statistics

import pytest

from hookwrap._bench.paired import Estimate, block_minima, differences, interleaved, median_interval, paired

US = 1e-6


def _binomial_below(n: int, r: int) -> float:
    return sum(math.comb(n, i) for i in range(r)) / 2 ** n


@pytest.mark.parametrize("n", [1, 2, 5, 6, 9, 10, 17, 40, 41, 100, 400])
def test_the_median_interval_is_the_sign_test_s_widest_rule(n):
    i, j, coverage = median_interval(n)
    assert j == n - 1 - i
    r = i + 1  # the lower bound's 1-based order statistic
    if n >= 6:  # 95% reachable: at least 95%, and one step narrower would fall below it
        assert coverage == pytest.approx(1 - 2 * _binomial_below(n, r))
        assert coverage >= 0.95
        assert 1 - 2 * _binomial_below(n, r + 1) < 0.95
    else:  # the full range, with the coverage it has
        assert (i, j) == (0, n - 1) and coverage == pytest.approx(1 - 2 / 2 ** n)


def test_known_intervals():
    assert median_interval(9) == (1, 7, pytest.approx(0.9609375))
    assert median_interval(6) == (0, 5, pytest.approx(1 - 2 / 64))
    with pytest.raises(ValueError):
        median_interval(0)
    with pytest.raises(ValueError):
        median_interval(10, confidence=1.0)


def _steps(rng: random.Random, n: int, base: float = 450 * US, jitter: float = 4 * US) -> list[float]:
    return [base + rng.gauss(0, jitter) for _ in range(n)]


def test_preemptions_move_the_mean_not_the_median_of_pairs():
    """A true difference of 13 us; one call in five preempted for 2-4 ms (a busy
    neighbour on a shared core), falling on either variant: the mean difference is
    off by tens of microseconds, the median stays within 1.5 us."""
    rng = random.Random(1)
    plain = _steps(rng, 800)
    hooked = [t + 13 * US + rng.gauss(0, 4 * US) for t in plain]
    for series in (hooked, plain):
        for k in rng.sample(range(800), 160):
            series[k] += rng.uniform(2000, 4000) * US
    diffs = differences(hooked, plain)
    assert abs(statistics.mean(diffs) - 13 * US) > 20 * US
    est = paired(diffs)
    assert est.value == pytest.approx(13 * US, abs=1.5 * US)
    assert est.low < est.value < est.high and not est.noisy


def test_min_of_blocks_ignores_load_bursts_and_every_n_work():
    """Every call of a stretch of turns slowed by a load burst (both variants: it
    is the machine), each variant's every-10th call carrying a callback's periodic
    work (on one variant only, as a shared counter can place it), and 10% of calls
    preempted: the min-of-blocks difference stays at the true 13 us."""
    rng = random.Random(2)
    turns = 400
    plain = _steps(rng, turns, jitter=1 * US)
    hooked = [t + 13 * US for t in _steps(rng, turns, jitter=1 * US)]
    for turn in range(150, 250):  # a burst of load: both variants twice as slow
        plain[turn] *= 2
        hooked[turn] *= 2
    for turn in range(9, turns, 10):  # periodic work, always on the hooked variant
        hooked[turn] += 120 * US
    for series in (hooked, plain):
        for k in rng.sample(range(turns), 40):
            series[k] += 3000 * US
    by_pairs = paired(differences(hooked, plain))
    by_blocks = paired(block_minima(hooked, plain, 10))
    assert by_blocks.n == 40
    assert by_blocks.value == pytest.approx(13 * US, abs=1 * US)
    assert not by_blocks.noisy
    assert by_pairs.value > by_blocks.value  # the one-sided periodic work drags the pairs up


def test_too_noisy_when_the_interval_includes_zero():
    rng = random.Random(3)
    est = paired([rng.gauss(0.5 * US, 30 * US) for _ in range(40)])  # a tiny effect in big noise
    assert est.low <= 0 <= est.high
    assert est.noisy and "includes zero" in est.why_noisy()


def test_too_noisy_when_the_interval_is_wider_than_the_estimate():
    est = Estimate(value=2 * US, low=0.5 * US, high=9 * US, q1=0, q3=0, n=40, confidence=0.96)
    assert est.noisy and "wider than the estimate" in est.why_noisy()
    clear = Estimate(value=13 * US, low=11 * US, high=15 * US, q1=0, q3=0, n=40, confidence=0.96)
    assert not clear.noisy and clear.why_noisy() == ""


def test_a_negative_effect_is_measured_too():
    est = paired([-5 * US + d * 0.01 * US for d in range(-50, 51)])
    assert est.value == pytest.approx(-5 * US) and not est.noisy


def test_interleaved_calls_each_variant_once_per_turn_in_a_shuffled_order():
    calls: list[tuple[str, int]] = []
    now = [0.0]

    def clock() -> float:
        return now[0]

    def variant(name: str, cost: float):
        def run(item: int) -> None:
            calls.append((name, item))
            now[0] += cost
        return run

    times = interleaved([variant("a", 3.0), variant("b", 1.0), variant("c", 2.0)], [10, 11], 60, clock=clock)
    assert times == [[3.0] * 60, [1.0] * 60, [2.0] * 60]  # each call timed on its own
    for turn in range(60):
        three = calls[3 * turn:3 * turn + 3]
        assert sorted(name for name, _ in three) == ["a", "b", "c"]
        assert {item for _, item in three} == {10 + turn % 2}  # the same input for all
    firsts = [calls[3 * turn][0] for turn in range(60)]
    assert all(firsts.count(name) >= 10 for name in "abc")  # no variant always first
    again: list[tuple[str, int]] = []
    calls, now[0] = again, 0.0
    interleaved([variant("a", 3.0), variant("b", 1.0), variant("c", 2.0)], [10, 11], 60, clock=clock)
    assert [n for n, _ in again][:30] == [n for n, _ in calls][:30]  # seeded: the same order every run


def test_block_minima_checks_its_input():
    assert block_minima([5, 1, 4, 9, 9], [2, 3, 1, 0, 7], 2) == [1 - 2, 4 - 0]  # a short last block is left out
    with pytest.raises(ValueError):
        block_minima([1.0], [1.0, 2.0], 1)
    with pytest.raises(ValueError):
        differences([1.0], [])


def _costs(demo, own: Estimate):
    work = Estimate(value=40 * US, low=38 * US, high=42 * US, q1=35 * US, q3=45 * US, n=15, confidence=0.96)
    return demo.StepCosts(hooked_step=505 * US, hand_step=492 * US, plain_step=452 * US, own=own,
                          work=work, calls=15, pairs=400)


def test_the_report_gives_hookwrap_s_own_cost_apart_from_the_callbacks_work():
    demo = pytest.importorskip("hookwrap.demo")
    own = Estimate(value=13 * US, low=11.5 * US, high=14.9 * US, q1=10 * US, q3=16 * US, n=40, confidence=0.9615)
    lines = demo.overhead_lines(_costs(demo, own))
    assert len(lines) == 2 and all(len(line) <= 130 for line in lines)
    assert lines[0] == ("hook overhead (hookwrap's own): +13.0 us a step = +2.9% of 452 us (96% interval "
                        "+11.5 to +14.9 us; 15 callback calls vs. by hand)")
    assert lines[1] == "callbacks' work (theirs): +40.0 us a step written by hand, +53.0 us through hookwrap"


def test_the_report_says_when_the_machine_was_too_noisy():
    demo = pytest.importorskip("hookwrap.demo")
    own = Estimate(value=3 * US, low=-4 * US, high=12 * US, q1=-10 * US, q3=20 * US, n=40, confidence=0.9615)
    lines = demo.overhead_lines(_costs(demo, own))
    assert len(lines) == 3
    assert lines[2].startswith("note: the machine was too noisy to measure hookwrap's own cost this run "
                               "(its 96% interval includes zero)")


# --- the step written by hand ------------------------------------------------------------


def _demo_trainer(tmp_path):
    pytest.importorskip("torch")
    demo = importlib.import_module("hookwrap.demo")
    from hookwrap.examples.trainer import make_run

    trainer = make_run("cpu", trainer_class=demo._demo_trainer_class())
    trainer.out, trainer.history = (lambda line: None), []
    seen: list[int] = []

    @trainer.before("loss")
    def count_samples(self, targets):
        seen.append(len(targets))
        return targets

    callbacks, _ = demo.callback_set(tmp_path, stream=io.StringIO())
    for callback in callbacks:
        trainer.add_callback(callback)
    return demo, trainer, callbacks, seen


def test_the_hand_written_step_calls_what_hookwrap_calls(hw, tmp_path):
    from hookwrap._callback import boundary

    demo, trainer, callbacks, seen = _demo_trainer(tmp_path)
    timer = callbacks[3]
    batches = list(trainer.train_loader)
    hand, plain, calls = demo.hand_written_steps(trainer)
    assert calls == sum(len(chain) for event, chain in hw.describe(trainer).chains.items()
                        if event in demo.PER_STEP_EVENTS) == 15
    with boundary():
        trainer.step(batches[0])
        after_hooked = (timer.count, len(seen), trainer.steps)
        loss = hand(batches[1])
        assert (timer.count, len(seen), trainer.steps) == (after_hooked[0] + 1, after_hooked[1] + 1,
                                                           after_hooked[2] + 1)
        assert seen[-1] == len(batches[1][1]) and float(loss) > 0
        plain(batches[2])  # the loop alone: no callback runs, the step still counts
        assert (timer.count, len(seen), trainer.steps) == (after_hooked[0] + 1, after_hooked[1] + 1,
                                                           after_hooked[2] + 2)


def test_the_hand_written_step_trains_as_the_hooked_one(hw, tmp_path):
    """From the same weights and optimizer state, one step each way gives the same loss
    and the same weights: the hand-written loop is the example trainer's step."""
    import copy

    torch = pytest.importorskip("torch")

    from hookwrap._callback import boundary

    demo, trainer, _, _ = _demo_trainer(tmp_path)
    batch = next(iter(trainer.train_loader))
    state = copy.deepcopy((trainer.model.state_dict(), trainer.optimizer.state_dict()))
    hand, _, _ = demo.hand_written_steps(trainer)
    with boundary():
        hooked_loss = trainer.step(batch)
        hooked_weights = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.model.load_state_dict(state[0])
        trainer.optimizer.load_state_dict(state[1])
        hand_loss = hand(batch)
    assert torch.equal(hooked_loss, hand_loss)
    assert all(torch.equal(a, b) for a, b in zip(hooked_weights, trainer.model.parameters()))


def test_a_registration_it_cannot_write_by_hand_is_refused(hw, tmp_path):
    demo, trainer, _, _ = _demo_trainer(tmp_path)
    trainer.after("backward", lambda self: None, every=3)
    with pytest.raises(ValueError, match="post-backward"):
        demo.hand_written_steps(trainer)
