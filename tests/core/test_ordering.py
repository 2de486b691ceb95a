"""docs/design/contract.md §3: order within a tier -- registration order, prepend, before=/after=."""

from __future__ import annotations

from typing import Any

import pytest


def make(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self):
            pass

    return Trainer()


def recorder(log, name):
    def cb(self):
        log.append(name)

    cb.__name__ = cb.__qualname__ = name
    return cb


def test_prepend_puts_the_latest_first(hw):
    t, log = make(hw), []
    t.before("step", recorder(log, "a"))
    t.before("step", recorder(log, "b"), prepend=True)
    t.before("step", recorder(log, "c"), prepend=True)
    t.step()
    assert log == ["c", "b", "a"]


def test_before_and_after_by_function_or_name(hw):
    t, log = make(hw), []
    a, b, c = (recorder(log, n) for n in "abc")
    t.before("step", a)
    t.before("step", b, after="c")
    t.before("step", c, before=a)
    t.step()
    assert log == ["c", "a", "b"]


def test_constraints_are_order_independent(hw):
    t, log = make(hw), []
    a, b = recorder(log, "a"), recorder(log, "b")
    t.before("step", a, after=b)  # b is registered later: still honoured
    t.before("step", b)
    t.step()
    assert log == ["b", "a"]


def test_a_cycle_is_refused_at_registration_and_leaves_nothing_behind(hw):
    t, log = make(hw), []
    a, b = recorder(log, "a"), recorder(log, "b")
    t.before("step", a, after="b")
    with pytest.raises(hw.HookError, match=r"constraints form a cycle: .*a.* -> .*b.* -> .*a"):
        t.before("step", b, after="a")
    assert len(t.callbacks) == 1
    t.step()
    assert log == ["a"]


def test_a_cycle_across_two_spellings_of_one_join_point_is_refused_at_registration(hw):
    """'train-step' and 'train_step' name one join point: their callbacks are
    ordered together, so a cycle between them is found when the second is added
    (it was found only at the next call)."""
    class Trainer(hw.Hookable):
        @hw.hookable
        def train_step(self):
            pass

    t, log = Trainer(), []
    a, b = recorder(log, "a"), recorder(log, "b")
    t.before("train_step", a, after="b")
    with pytest.raises(hw.HookError, match=r"constraints form a cycle"):
        t.before("train-step", b, after="a")
    t.train_step()
    assert log == ["a"]


def test_a_cycle_across_a_base_and_a_subclass_is_refused_at_registration(hw):
    """Class registrations of a base and of its subclass are ordered together (one
    class tier): a cycle between them is refused when the second is registered,
    whichever comes first, where every call of the subclass raised."""
    class T(hw.Hookable):
        @hw.hookable
        def train_step(self):
            pass

    class S(T):
        pass

    log = []
    a, b = recorder(log, "a"), recorder(log, "b")
    with hw.before(T, "train_step", a, before=b):
        with pytest.raises(hw.HookError, match=r"constraints form a cycle"):
            hw.before(S, "train_step", b, before=a)
        S().train_step()
    assert log == ["a"]
    with hw.before(S, "train_step", b, before=a):
        with pytest.raises(hw.HookError, match=r"constraints form a cycle"):
            hw.before(T, "train_step", a, before=b)  # the cycle is in S's tier
        T().train_step()
        S().train_step()
    assert log == ["a", "b"]


def test_a_cycle_with_a_declared_class_entry_is_refused_at_registration(hw):
    log = []
    a, b = recorder(log, "a"), recorder(log, "b")

    class T(hw.Hookable):
        callbacks = [("pre-train_step", a)]

        @hw.hookable
        def train_step(self):
            pass

    with pytest.raises(hw.HookError, match=r"constraints form a cycle"):
        hw.before(T, "train_step", b, before=a, after=a)
    T().train_step()
    assert log == ["a"]


def test_constraints_apply_within_a_tier_only(hw):
    log = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self):
            pass

        def pre_step_callback(self):
            log.append("class")

    t = Trainer()
    t.before("step", recorder(log, "instance"), before="pre_step_callback", prepend=True)
    t.step()
    assert log == ["class", "instance"]  # core -> user, whatever the options


def test_ordering_by_callback_object(hw):
    log = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self):
            pass

    class Logger(hw.Callback):
        def pre_step(self, trainer):
            log.append("logger")

    t = Trainer()
    logger = Logger()
    t.add_callback(logger)
    t.before("step", recorder(log, "first"), before=logger)
    t.before("step", recorder(log, "by class"), before=Logger)
    t.step()
    assert log == ["first", "by class", "logger"]


def test_many_prepends_and_a_long_before_chain_stay_cheap(hw, monkeypatch):
    """Audit item 13: 400 prepend=True registrations took 6.5 s (every registration
    matched every pair of entries), and a long before= chain ended in a bare
    RecursionError. Counted, not timed: prepend alone matches no pair at all."""
    import sys

    import hookwrap._entries as options

    matched = []
    real_matches = options._matches
    monkeypatch.setattr(options, "_matches", lambda ref, fn: matched.append(1) or real_matches(ref, fn))
    t = make(hw)
    log: list[int] = []

    def numbered(i: int) -> Any:
        def cb(self: Any) -> None:
            log.append(i)
        cb.__name__ = cb.__qualname__ = f"cb{i}"
        return cb

    for i in range(400):
        t.before("step", numbered(i), prepend=True)
    t.step()
    assert log == list(range(399, -1, -1))
    assert matched == []

    # A chain of before= deeper than the recursion limit: ordered without recursing.
    from hookwrap._entries import Registration, make_options, order_entries

    fns = [numbered(i) for i in range(300)]
    entries = [Registration("pre-step", fns[0])] + [
        Registration("pre-step", fns[i], make_options("test", before=fns[i - 1])) for i in range(1, 300)]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(150)
    try:
        ordered = order_entries(entries)
    finally:
        sys.setrecursionlimit(limit)
    assert [e[1] for e in ordered] == fns[::-1]
