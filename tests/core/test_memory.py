"""Nothing hookwrap holds keeps a user's class, woven class, instance or removed
callback alive, and a registration invalidates only the chains it can change.

Both implementations (the ``hw`` fixture). Liveness is read through weak
references after ``gc.collect()``: classes are cyclic (``cls.__mro__`` holds
``cls``), so only the collector ever frees them.
"""

from __future__ import annotations

import gc
import importlib
import sys
import weakref
from typing import Any

import pytest


class Payload:
    """What a callback holds in real code: a model, a tensor, a logger."""


def alive(refs: list[weakref.ref[Any]]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in refs)


def _hookable_class(hw: Any, name: str) -> type:
    class Base(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            return batch

    return type(name, (Base,), {})


def test_classes_created_at_run_time_are_freed(hw):
    refs = []
    for i in range(200):
        cls = _hookable_class(hw, f"Dynamic{i}")
        obj = cls()
        if i % 3 == 1:
            hw.before(cls, "step", lambda self, batch: batch)
        if i % 3 == 2:
            obj.after("step", lambda self, return_value: return_value)
        assert obj.step(i) == i
        refs.append(weakref.ref(cls))
        del cls, obj
    assert alive(refs) == 0


def test_subclasses_of_a_long_lived_class_are_freed(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            return batch

    hw.before(Trainer, "step", lambda self, batch: batch)
    refs = []
    for i in range(100):
        sub = type(f"Sub{i}", (Trainer,), {})
        assert sub().step(i) == i  # Trainer.step (and init) now hold a chain for `sub`
        refs.append(weakref.ref(sub))
        del sub
    assert alive(refs) == 0
    assert Trainer().step(1) == 1  # the long-lived class still dispatches


def test_woven_then_removed_classes_are_freed(hw):
    refs = []
    for i in range(100):
        third_party = type(f"ThirdParty{i}", (), {"step": lambda self, batch: batch + 1})
        handle = hw.weave(third_party, "step")
        obj = third_party()
        hw.before(third_party, "step", lambda self, batch: batch * 2)
        hw.after(obj, "step", lambda self, return_value: return_value)
        assert obj.step(1) == 3
        handle.remove()
        assert obj.step(1) == 2
        refs.append(weakref.ref(third_party))
        del third_party, obj, handle
    assert alive(refs) == 0


def _callback_holding(payload: Payload) -> Any:
    def callback(self, batch):
        callback.payload  # noqa: B018 - it uses what it holds
        return batch

    callback.payload = payload  # type: ignore[attr-defined]
    return callback


@pytest.mark.parametrize("tier", ["instance", "class", "function", "global"])
def test_removed_callbacks_and_what_they_hold_are_freed(hw, tier):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            return batch

    @hw.hookable
    def transform(batch):
        return batch

    trainer = Trainer()
    trainer.before("step", lambda self, batch: batch)  # the object also has instance state
    refs = []
    for i in range(50):
        payload = Payload()
        refs.append(weakref.ref(payload))
        callback = _callback_holding(payload)
        if tier == "instance":
            handle = trainer.before("step", callback)
        elif tier == "class":
            handle = hw.before(Trainer, "step", callback)
        elif tier == "function":
            handle = transform.before(lambda batch, cb=callback: cb(None, batch))
        else:
            handle = hw.register_global_callback(("pre-step", callback))
        assert trainer.step(i) == i and transform(i) == i
        handle.remove()
        del payload, callback, handle
    assert alive(refs) == 0
    assert trainer.step(1) == 1


def test_callbacks_of_a_with_block_are_freed(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            return batch

    trainer = Trainer()
    payload = Payload()
    ref = weakref.ref(payload)
    with trainer.before("step", _callback_holding(payload)):
        trainer.step(1)
    del payload
    assert alive([ref]) == 0


@pytest.mark.parametrize("tier", ["instance", "class", "global"])
def test_registering_and_removing_10000_callbacks_leaves_memory_flat(hw, tier):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            return batch

    trainer = Trainer()

    def cycle(n: int) -> None:
        for i in range(n):
            def callback(self, batch):
                return batch

            if tier == "instance":
                handle = trainer.before("step", callback)
            elif tier == "class":
                handle = hw.before(Trainer, "step", callback)
            else:
                handle = hw.register_global_callback(("pre-step", callback))
            trainer.step(i)
            handle.remove()

    cycle(1000)  # warm: caches, code objects, interned names
    gc.collect()
    before = sys.getallocatedblocks()
    cycle(10_000)
    gc.collect()
    # Anything kept per cycle, even one small object, would show as 10,000 blocks.
    assert sys.getallocatedblocks() - before < 500


class CountingPlanner:
    """Stands in for a join point's planner, noting each chain it hands out: ``built``
    lists the class or instance state each new chain was built for (a chain
    found again in its owner's cache is not new)."""

    def __init__(self, planner: Any) -> None:
        self.planner = planner
        self.built: list[Any] = []
        self.seen: dict[Any, Any] = {}
        self.wrapped_runner = planner.wrapped_runner

    def _note(self, key: Any, chain: Any) -> Any:
        if self.seen.get(key) is not chain:
            self.seen[key] = chain
            self.built.append(key)
        return chain

    def type_chain(self, jp: Any, tp: Any) -> Any:
        return self._note(tp, self.planner.type_chain(jp, tp))

    def instance_chain(self, state: Any, jp: Any, type_chain: Any) -> Any:
        return self._note(state, self.planner.instance_chain(state, jp, type_chain))


def _counting(hw: Any, cls: type, name: str) -> CountingPlanner:
    joinpoints = importlib.import_module("hookwrap._joinpoints")
    jp = joinpoints.join_point_of(vars(cls)[name])
    counting = CountingPlanner(jp.planner)
    jp.planner = counting
    return counting


def test_a_registration_rebuilds_only_the_chains_it_changes(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            return batch

        @hw.hookable
        def evaluate(self):
            return 0

    class Sibling(Trainer):
        pass

    class Other(Trainer):
        pass

    mine, theirs, sibling = Trainer(), Trainer(), Sibling()
    theirs.before("step", lambda self, batch: batch)
    with mine.before("step", lambda self, batch: batch):
        pass  # `mine` now holds instance state, as it will in the loop
    steps, evaluates = _counting(hw, Trainer, "step"), _counting(hw, Trainer, "evaluate")
    for obj in (mine, theirs, sibling):
        obj.step(1)
        obj.evaluate()
    steps.built.clear()
    evaluates.built.clear()

    for _ in range(5):  # scoped registrations on one object, as in a training loop
        with mine.before("step", lambda self, batch: batch):
            mine.step(1)
        theirs.step(1)
        sibling.step(1)
        mine.evaluate()
    assert theirs.__dict__["__hookwrap__"] not in steps.built
    assert Sibling not in steps.built
    assert evaluates.built == []

    with hw.before(Other, "step", lambda self, batch: batch):  # another class's tier
        for obj in (mine, theirs, sibling):
            obj.step(1)
            obj.evaluate()
    assert Sibling not in steps.built and evaluates.built == []

    with hw.before(Trainer, "evaluate", lambda self: None):  # the base class's tier
        sibling.evaluate()
        sibling.step(1)
    assert evaluates.built == [Sibling]
    assert Sibling not in steps.built


@pytest.mark.parametrize("kind", ["call", "emit"])
def test_distinct_keyword_sets_keep_the_plans_bounded(hw, kind):
    """Audit (issue 21) item 12: a plan is kept per call shape (the keyword names
    passed) and per set of emitted keywords; a program passing ever new names
    keeps at most MAX_CALL_SHAPES of them per chain or custom event, so memory
    stays flat however many it passes."""
    class Trainer(hw.Hookable):
        emits = ("on_logged",)

        @hw.hookable
        def step(self, **metrics):
            return len(metrics)

    trainer = Trainer()
    ran = []
    trainer.before("step", lambda self: ran.append(1))
    trainer.on("on_logged", lambda self: ran.append(1))

    def cycle(start: int, n: int) -> None:
        for i in range(start, start + n):
            keywords = {f"metric_{i}_{j}": j for j in range(3)}
            if kind == "call":
                assert trainer.step(**keywords) == 3
            else:
                trainer.emit("on_logged", **keywords)

    cycle(0, 300)  # past the bound: every cache is as full as it gets
    gc.collect()
    before = sys.getallocatedblocks()
    cycle(1000, 1200)
    gc.collect()
    # Each shape kept would hold several blocks (its key, plan, runner): 1,200 of
    # them would show as 10,000 or more. (What remains moves up and down with
    # the size of the dictionaries the names pass through.)
    assert sys.getallocatedblocks() - before < 2000
    assert len(ran) == 1500  # a shape not kept runs its callbacks all the same
    assert importlib.import_module("hookwrap._rules").MAX_CALL_SHAPES == 64
