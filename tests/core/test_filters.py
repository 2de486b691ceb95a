"""docs/design/contract.md §4: every=N, once=True, when=predicate(obj) on any registration."""

from __future__ import annotations

from typing import Any

import pytest


def make(hw):
    class Trainer(hw.Hookable):
        def __init__(self):
            self.training = True

        @hw.hookable
        def step(self, i):
            return i

    return Trainer()


def test_every_fires_on_calls_n_2n(hw):
    t = make(hw)
    seen = []
    t.after("step", lambda self, i: seen.append(i), every=3)
    for i in range(1, 10):
        t.step(i)
    assert seen == [3, 6, 9]


def test_once_fires_a_single_time(hw):
    t = make(hw)
    seen = []
    t.before("step", lambda self, i: (seen.append(i), i)[1], once=True)
    for i in range(4):
        t.step(i)
    assert seen == [0]


def test_when_predicate_gets_the_object(hw):
    t = make(hw)
    seen = []
    t.after("step", lambda self, i: seen.append(i), when=lambda obj: obj.training)
    t.step(1)
    t.training = False
    t.step(2)
    t.training = True
    t.step(3)
    assert seen == [1, 3]


def test_filters_combine_and_count_only_admitted_calls(hw):
    t = make(hw)
    seen = []
    t.after("step", lambda self, i: seen.append(i), every=2, when=lambda obj: obj.training)
    for i in range(1, 9):
        t.training = i % 3 != 0  # 3 and 6 are not counted
        t.step(i)
    assert seen == [2, 5, 8]


def test_filtered_callback_handle_removes_it(hw):
    t = make(hw)
    seen = []
    h = t.after("step", lambda self, i: seen.append(i), every=2)
    t.step(1)
    t.step(2)
    h.remove()
    t.step(3)
    t.step(4)
    assert seen == [2]


def test_filters_on_around_and_error(hw):
    t = make(hw)
    t.around("step", lambda self, proceed, i: proceed(i) * 100, every=2)
    assert [t.step(1), t.step(1), t.step(1), t.step(1)] == [1, 100, 1, 100]


@pytest.mark.parametrize(
    "opts, message",
    [
        ({"every": 0}, r"every=0 must be a whole number >= 1"),
        ({"every": 1.5}, r"every=1.5 must be a whole number"),
        ({"when": 3}, r"when=3 must be a predicate"),
    ],
)
def test_bad_filter_options(hw, opts, message):
    t = make(hw)
    with pytest.raises(hw.HookError, match=message):
        t.after("step", lambda self: None, **opts)


def test_unknown_option_is_refused_with_the_closest(hw):
    t = make(hw)
    with pytest.raises(hw.HookError, match="evrey= is not a registration option. Did you mean 'every'"):
        t.after("step", lambda self: None, evrey=2)


def test_rank_zero_only_fires_on_rank_zero_alone(hw, monkeypatch):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, i):
            return i

    seen = []
    t = Trainer()
    t.after("step", lambda self, i: seen.append(i), rank_zero_only=True)
    monkeypatch.delenv("RANK", raising=False)
    t.step(1)  # not distributed: this process is rank 0
    monkeypatch.setenv("RANK", "1")  # torchrun's rank, before the process group starts
    t.step(2)
    monkeypatch.setenv("RANK", "0")
    t.step(3)
    assert seen == [1, 3]
    assert "[rank_zero_only=True]" in str(hw.describe(t, "post-step"))
    with pytest.raises(hw.HookError, match=r"rank_zero_only='yes' must be True or False"):
        t.after("step", lambda self: None, rank_zero_only="yes")


def test_a_callback_class_can_be_rank_zero_only(hw, monkeypatch):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self):
            pass

    class Printer(hw.Callback):
        rank_zero_only = True

        def __init__(self):
            self.calls = 0

        def post_step(self, trainer):
            self.calls += 1

    printer = Printer()
    t = Trainer()
    t.add_callback(printer)
    monkeypatch.setenv("RANK", "3")
    t.step()
    monkeypatch.setenv("RANK", "0")
    t.step()
    assert printer.calls == 1


def test_once_with_when_fires_once_under_concurrent_calls(hw):
    """Audit item 5: the check and the spending of once=True are one step."""
    import threading
    import time

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, i: int) -> int:
            return i

    fired = []

    def slow_when(obj: Any) -> bool:
        time.sleep(0.001)  # lets another thread in between the check and the spending
        return True

    trainer = Trainer()
    trainer.after("step", lambda self: fired.append(1), once=True, when=slow_when)
    barrier = threading.Barrier(4)

    def call() -> None:
        barrier.wait()
        for i in range(20):
            trainer.step(i)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fired == [1]


def test_a_shallow_copy_counts_its_own_calls(hw):
    """Audit item 9: copy.copy shared the every/once counters with the original."""
    import copy

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, i: int) -> int:
            return i

    fired: list[str] = []
    original = Trainer()
    original.after("step", lambda self: fired.append("every"), every=2)
    original.after("step", lambda self: fired.append("once"), once=True)
    original.step(0)  # counted once, once spent
    duplicate = copy.copy(original)
    duplicate.step(0)  # its own counter: 2, fires; its once: already spent as copied
    original.step(0)  # the original's counter: 2, fires
    assert fired == ["once", "every", "every"]
    duplicate.step(0)
    original.step(0)
    assert fired == ["once", "every", "every"]


def test_a_raising_when_predicate_is_noted_with_the_callback_it_filters(hw):
    """Audit item 24 (first part)."""
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, i: int) -> int:
            return i

    def ready(obj: Any) -> bool:
        raise ValueError("not ready")

    def log_step(self: Any) -> None:
        pass

    trainer = Trainer()
    trainer.after("step", log_step, when=ready)
    with pytest.raises(ValueError, match="not ready") as caught:
        trainer.step(1)
    notes = getattr(caught.value, "__notes__", [])
    assert any("raised in the when= predicate of callback" in note and "log_step" in note
               and "'post-step'" in note for note in notes), notes
