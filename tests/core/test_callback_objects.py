"""docs/design/contract.md §3: class-based callbacks (hw.Callback) and the global tier."""

from __future__ import annotations

from typing import Any

import pytest


def make(hw):
    class Trainer(hw.Hookable):
        emits = ("on_validation_end",)

        @hw.hookable("loss")
        def compute_loss(self, batch):
            return batch * 2

        @hw.hookable
        def step(self, batch):
            return self.compute_loss(batch)

        def validate(self):
            self.emit("on_validation_end", metrics={"acc": 0.5}, epoch=1)

    return Trainer


def test_callback_methods_follow_the_function_rules(hw):
    Trainer = make(hw)
    log = []

    class Scaler(hw.Callback):
        def __init__(self, factor):
            self.factor = factor

        def pre_loss(self, trainer, batch):
            log.append(("pre-loss", batch))
            return batch * self.factor

        def post_step(self, trainer, return_value):
            log.append(("post-step", return_value))
            return return_value

        def on_validation_end(self, trainer, metrics):
            log.append(("validation", metrics["acc"]))

        def helper(self):  # not an event name: left alone
            raise AssertionError("never called")

    t = Trainer()
    handle = t.add_callback(Scaler(10))
    assert t.step(1) == 20
    t.validate()
    assert log == [("pre-loss", 1), ("post-step", 20), ("validation", 0.5)]
    handle.remove()
    assert t.step(1) == 2
    assert t.callbacks == []


def test_callback_methods_get_their_object_and_their_errors_are_noted(hw):
    # Bound methods are called through their function with the callback object
    # as first argument (the fast path's own method call): same arguments, same
    # keyword passing, same note on an error.
    Trainer = make(hw)

    class Picky(hw.Callback):
        def __init__(self):
            self.seen = []

        def pre_loss(self, trainer, *, batch):
            self.seen.append((trainer, batch))
            if batch < 0:
                raise ValueError("negative batch")
            return batch

    t, picky = Trainer(), Picky()
    t.add_callback(picky)
    assert t.compute_loss(batch=3) == 6 and t.compute_loss(4) == 8
    assert picky.seen == [(t, 3), (t, 4)]
    with pytest.raises(ValueError, match="negative batch") as info:
        t.compute_loss(-1)
    assert len(info.value.__notes__) == 1 and "pre_loss" in info.value.__notes__[0]


def test_misspelled_event_method_is_refused_with_the_closest_names(hw):
    Trainer = make(hw)

    class Typo(hw.Callback):
        def pre_los(self, trainer, batch):
            return batch

    with pytest.raises(hw.UnknownEventError, match=r"Typo.pre_los looks like an event method.*Did you mean 'pre_loss'"):
        Trainer().add_callback(Typo())

    class CustomTypo(hw.Callback):
        def on_validaton_end(self, trainer, metrics):
            pass

    with pytest.raises(hw.UnknownEventError, match=r"Did you mean 'on_validation_end'"):
        Trainer().add_callback(CustomTypo())


def test_callback_signature_errors_name_the_method(hw):
    Trainer = make(hw)

    class Bad(hw.Callback):
        def pre_loss(self, trainer, btach):
            return btach

    with pytest.raises(hw.CallbackSignatureError, match=r"Bad.pre_loss .*asks for 'btach'.*Valid names: batch"):
        Trainer().add_callback(Bad())


def test_add_callback_needs_a_callback(hw):
    Trainer = make(hw)
    with pytest.raises(TypeError, match=r"expected a hookwrap.Callback instance, got function"):
        Trainer().add_callback(lambda self: None)


def test_global_callback_applies_after_class_and_instance_tiers(hw):
    Trainer = make(hw)
    log = []

    class Global(hw.Callback):
        def pre_loss(self, trainer, batch):
            log.append("global")
            return batch

    t = Trainer()
    t.before("loss", lambda self: log.append("instance"))
    handle = hw.register_global_callback(Global())
    try:
        t.compute_loss(1)
        Trainer().compute_loss(1)
    finally:
        handle.remove()
    t.compute_loss(1)
    assert log == ["instance", "global", "global", "instance"]


def test_global_tuple_and_unknown_event(hw):
    Trainer = make(hw)
    log = []
    with hw.register_global_callback(("post-loss", lambda self, return_value: log.append(return_value) or return_value)):
        Trainer().compute_loss(3)
    Trainer().compute_loss(3)
    assert log == [6]
    with pytest.raises(hw.UnknownEventError, match=r"no join point 'losss' exists.*Did you mean 'post-loss'"):
        hw.register_global_callback(("post-losss", lambda self: None))
    with pytest.raises(TypeError, match=r"expected a hookwrap.Callback instance or an \('event', fn\) pair"):
        hw.register_global_callback("post-loss")


def test_callback_is_a_context_manager_registering_globally(hw):
    Trainer = make(hw)
    log = []

    class Counter(hw.Callback):
        def post_loss(self, trainer, return_value):
            log.append(return_value)
            return return_value

    t = Trainer()
    with Counter() as counter:
        assert isinstance(counter, Counter)
        t.compute_loss(1)
    t.compute_loss(2)
    assert log == [2]


def test_global_signature_checked_against_known_join_points(hw):
    make(hw)
    with pytest.raises(hw.CallbackSignatureError, match=r"asks for 'nope'"):
        hw.register_global_callback(("pre-loss", lambda self, nope: nope))


def test_class_level_registration_applies_to_all_instances_and_subclasses(hw):
    Trainer = make(hw)
    log = []

    class Child(Trainer):
        def pre_loss_callback(self, batch):
            log.append("declared")
            return batch

    handle = hw.before(Trainer, "loss", lambda self, batch: (log.append("registered"), batch)[1])
    Child().compute_loss(1)
    Trainer().compute_loss(1)
    handle.remove()
    Child().compute_loss(1)
    assert log == ["declared", "registered", "registered", "declared"]


def test_method_join_point_verbs_register_on_its_class(hw):
    Trainer = make(hw)
    log = []
    with Trainer.compute_loss.before(lambda self, batch: (log.append(batch), batch)[1]):
        Trainer().compute_loss(7)
    Trainer().compute_loss(8)
    assert log == [7]


def test_plain_function_registrations(hw):
    @hw.hookable
    def train_step(model, batch):
        return model + batch

    log = []
    h1 = train_step.before(lambda batch: batch * 10)
    h2 = hw.after(train_step, "train_step", lambda return_value: (log.append(return_value), return_value)[1])
    assert train_step(1, 2) == 21
    assert log == [21]
    h1.remove()
    h2.remove()
    assert train_step(1, 2) == 3
    with pytest.raises(hw.UnknownEventError, match=r"has no event 'pre-other'"):
        hw.before(train_step, "other", lambda: None)
    with pytest.raises(hw.CallbackSignatureError, match=r"first parameter|asks for 'self'"):
        train_step.before(lambda self, batch: batch)


def test_module_target(hw):
    import types

    module = types.ModuleType("fake_training")

    @hw.hookable
    def train_step(batch):
        return batch

    module.train_step = train_step
    with hw.before(module, "train_step", lambda batch: batch + 1):
        assert module.train_step(1) == 2
    with pytest.raises(hw.UnknownEventError, match=r"module fake_training has no join point 'train_stp'.*Did you mean 'train_step'"):
        hw.before(module, "train_stp", lambda batch: batch)


def module_of_two(hw):
    """A module holding two hookable functions, ``f`` and ``g`` (each returns x)."""
    import types

    module = types.ModuleType("fake_training")

    @hw.hookable
    def f(x):
        return x

    @hw.hookable
    def g(x):
        return x

    module.f, module.g = f, g
    return module


def test_a_callback_refused_on_one_function_of_a_module_registers_on_none(hw):
    """add_callback(module, cb) is all or nothing: a callback method that does not fit
    the second function is refused before the first one's is stored."""
    module = module_of_two(hw)

    class Doubler(hw.Callback):
        def post_f(self, return_value):
            return return_value * 2

        def pre_g(self, missing):  # no argument 'missing'
            return None

    with pytest.raises(hw.CallbackSignatureError, match=r"missing"):
        hw.add_callback(module, Doubler())
    assert module.f(3) == 3  # post_f was not left behind


def test_a_callback_whose_order_is_refused_on_one_function_of_a_module_registers_on_none(hw):
    module, log = module_of_two(hw), []

    class Both(hw.Callback):
        def pre_f(self, x):
            log.append("cb.f")
            return x

        def pre_g(self, x):
            log.append("cb.g")
            return x

    cb = Both()

    def h(x):
        log.append("h")
        return x

    module.g.before(h, before=cb)
    with pytest.raises(hw.HookError, match=r"constraints form a cycle"):
        hw.add_callback(module, cb, before=h)  # h -> cb.pre_g -> h on g
    module.f(1)
    module.g(1)
    assert log == ["h"]  # pre_f was not left behind on f


def test_instance_without_dict(hw):
    class Slotted:
        __slots__ = ()

        @hw.hookable
        def step(self):
            pass

    with pytest.raises(hw.HookError, match=r"Slotted instances have no __dict__.*hookwrap.before\(Slotted, \.\.\.\)"):
        hw.before(Slotted(), "step", lambda self: None)
    with hw.before(Slotted, "step", lambda self: None):
        Slotted().step()


def test_add_callback_takes_registration_options(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, i):
            return i

        @hw.hookable
        def evaluate(self):
            return 0

    class Recorder(hw.Callback):
        def __init__(self):
            self.steps, self.evaluations = [], 0

        def post_step(self, trainer, i):
            self.steps.append(i)

        def post_evaluate(self, trainer):
            self.evaluations += 1

    t, recorder = Trainer(), Recorder()
    handle = t.add_callback(recorder, every=2)
    for i in range(1, 6):
        t.step(i)
        t.evaluate()
    assert recorder.steps == [2, 4]  # each event method counts its own calls
    assert recorder.evaluations == 2
    handle.remove()
    with pytest.raises(hw.HookError, match=r"every=0 must be a whole number >= 1"):
        t.add_callback(Recorder(), every=0)
    assert hw.describe(t, "post-step").chains["post-step"] == []


def test_with_blocks_of_one_callback_nest_and_leave_nothing_behind(hw):
    """Audit item 4: nested blocks, and blocks in several threads at once."""
    import threading

    class Loop(hw.Hookable):
        @hw.hookable
        def step(self, x: int) -> int:
            return x

    class AddOne(hw.Callback):
        def pre_step(self, loop: Any, x: int) -> int:
            return x + 1

    cb = AddOne()
    with cb:
        with cb:  # nested: still registered once
            assert Loop().step(0) == 1
        assert Loop().step(0) == 1  # the outer block still holds it
    assert Loop().step(0) == 0

    errors: list[str] = []

    def blocks() -> None:
        for _ in range(300):
            with cb:
                result = Loop().step(0)
                if result != 1:
                    errors.append(f"step returned {result}")

    threads = [threading.Thread(target=blocks) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Loop().step(0) == 0  # nothing left registered
    assert hw.describe(Loop, "pre-step").chains["pre-step"] == []
