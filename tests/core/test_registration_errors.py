"""Bad callbacks fail at registration, naming the callback, the event and the fix."""

from __future__ import annotations

import os
from typing import Any

import pytest


def make_trainer(hw):
    class Trainer(hw.Hookable):
        @hw.hookable("loss")
        def compute_loss(self, batch, scale=1.0):
            return batch

    return Trainer


def test_unknown_parameter_lists_the_valid_names(hw):
    t = make_trainer(hw)()

    def cb(self, btach):
        return btach

    with pytest.raises(
        hw.CallbackSignatureError,
        match=r"callback .*cb .*for event 'pre-loss' of join point 'loss' \(.*Trainer.compute_loss\): "
        r"asks for 'btach', which .* does not have\. Valid names: batch, scale\.",
    ):
        t.before("loss", cb)
    assert t.callbacks == []


def test_var_args_and_var_kwargs_are_refused(hw):
    t = make_trainer(hw)()
    with pytest.raises(hw.CallbackSignatureError, match=r"takes \*args, but callbacks get only the arguments"):
        t.before("loss", lambda self, *args: None)
    with pytest.raises(hw.CallbackSignatureError, match=r"takes \*\*kw.*Valid names: batch, scale"):
        t.after("loss", lambda self, **kw: None)


def test_missing_self(hw):
    t = make_trainer(hw)()
    with pytest.raises(hw.CallbackSignatureError, match=r"takes no `self` parameter.*`def .+\(self, \.\.\.\)`"):
        t.before("loss", lambda: None)


def test_first_parameter_named_like_an_argument_means_self_was_forgotten(hw):
    t = make_trainer(hw)()

    def pre(batch):
        return batch

    with pytest.raises(
        hw.CallbackSignatureError,
        match=r"first parameter 'batch' would receive the hooked object.*`def pre\(self, batch, \.\.\.\)`",
    ):
        t.before("loss", pre)


@pytest.mark.parametrize("verb, name", [("after", "return_value"), ("on_error", "exception"),
                                        ("before", "return_value")])
def test_first_parameter_named_return_value_or_exception_means_self_was_forgotten(hw, verb, name):
    # `obj.after("step", lambda return_value: ...)` on a method join point was
    # accepted, and the call then failed with a contract error about a return value.
    t = make_trainer(hw)()
    with pytest.raises(
        hw.CallbackSignatureError,
        match=rf"first parameter {name!r} would receive the hooked object.*"
              rf"`def <lambda>\(self, {name}, \.\.\.\)`.*Valid names \(after `self`\): batch, scale",
    ):
        getattr(t, verb)("loss", (lambda return_value: return_value) if name == "return_value"
                         else (lambda exception: None))
    assert t.callbacks == []
    assert t.compute_loss(2) == 2


def test_return_value_is_for_post_callbacks_only(hw):
    t = make_trainer(hw)()
    with pytest.raises(
        hw.CallbackSignatureError, match=r"asks for 'return_value'.*given to post callbacks only"
    ):
        t.before("loss", lambda self, return_value: return_value)


def test_non_callable_callback(hw):
    t = make_trainer(hw)()
    with pytest.raises(hw.CallbackSignatureError, match=r"3 is not callable; register a function"):
        t.callbacks.append(("pre-loss", 3))


def test_bad_class_list_fails_when_the_class_is_defined(hw):
    with pytest.raises(hw.CallbackSignatureError, match=r"asks for 'lr'.*Valid names: batch"):

        class Trainer(hw.Hookable):
            callbacks = [("pre-step", lambda self, lr: lr)]

            @hw.hookable
            def step(self, batch):
                return batch


def test_mixin_with_an_unknown_event_fails_when_instantiated(hw):
    class Mixin(hw.Hookable):
        callbacks = [("post-stpe", lambda self: None)]

    with pytest.raises(hw.UnknownEventError, match=r"Mixin has no join point 'stpe'"):
        Mixin()


def test_bad_callback_method_fails_when_the_class_is_defined(hw):
    with pytest.raises(hw.UnknownEventError, match=r"has no join point 'stpe'.*Did you mean 'step'"):

        class Trainer(hw.Hookable):
            @hw.hookable
            def step(self, batch):
                return batch

            def pre_stpe_callback(self, batch):
                return batch


def test_event_strings_are_parsed_by_prefix_not_substring(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def predict(self, x):
            return x

    t = Trainer()
    with pytest.raises(hw.UnknownEventError, match=r"declares no custom event 'postpredict'. Did you mean 'post-predict'"):
        t.callbacks.append(("postpredict", lambda self: None))
    t.callbacks.append(("post-predict", lambda self, return_value: return_value + 1))
    assert t.predict(1) == 2  # a post callback: ran after, got the result


@pytest.mark.parametrize("entry", ["pre-step", ("pre-step",), ("pre-step", None, 1), ["pre-step", print]])
def test_malformed_entries(hw, entry):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self):
            pass

    with pytest.raises(hw.HookError, match=r"entries are \(event, callback\) pairs like \('pre-step', fn\)"):
        Trainer().callbacks.append(entry)


def test_unknown_phase(hw):
    t = make_trainer(hw)()
    with pytest.raises(hw.UnknownEventError, match=r"'during-loss' is not an event name. Events are '<phase>-<join point>' with a phase of pre, post, around, error.*Did you mean"):
        t.callbacks.append(("during-loss", lambda self: None))


def test_before_takes_a_join_point_not_an_event(hw):
    t = make_trainer(hw)()
    with pytest.raises(hw.HookError, match=r"before\(\) takes a join point name like 'step', got 'pre-loss'"):
        t.before("pre-loss", lambda self: None)


def test_class_callbacks_list_is_read_only(hw):
    Trainer = make_trainer(hw)

    class Child(Trainer):
        callbacks = [("pre-loss", lambda self: None)]

    assert [event for event, _ in Child.callbacks] == ["pre-loss"]
    with pytest.raises(hw.HookError, match=r"fixed when the class is created.*obj.callbacks.append"):
        Child.callbacks.append(("post-loss", lambda self: None))


def test_callback_method_that_is_not_a_function(hw):
    with pytest.raises(hw.HookError, match=r"pre_step_callback looks like a callback method but is a staticmethod"):

        class Trainer(hw.Hookable):
            @hw.hookable
            def step(self):
                pass

            pre_step_callback = staticmethod(lambda: None)


def test_both_twins_refuse_a_callback_asking_for_too_many_arguments(hw):
    names = [f"a{i}" for i in range(32)]
    namespace: dict = {}
    exec(f"def step(self, {', '.join(names)}):\n    return a0", namespace)
    exec(f"def greedy(self, {', '.join(names)}):\n    return None", namespace)
    exec(f"def fits(self, {', '.join(names[:31])}):\n    return None", namespace)
    Trainer = type("Trainer", (hw.Hookable,), {"step": hw.hookable(namespace["step"])})
    t = Trainer()
    with pytest.raises(hw.CallbackSignatureError, match=r"asks for 32 arguments; a callback may ask for at most 31"):
        t.after("step", namespace["greedy"])
    t.after("step", namespace["fits"])
    assert t.step(*range(32)) == 0


# --- options, Callback attributes and environment, refused by name (audit items 16, 17, 23) ---


@pytest.mark.parametrize("options, message", [
    ({"evry": 2}, r"evry= is not a registration option\. Did you mean 'every'\?"),
    ({"once": "no"}, r"once='no' must be True or False"),
    ({"prepend": "no"}, r"prepend='no' must be True or False"),
    ({"rank_zero_only": 1}, r"rank_zero_only=1 must be True or False"),
    ({"before": 42}, r"before=42 names no callback"),
    ({"after": [3.5]}, r"after=3\.5 names no callback"),
])
def test_bad_options_are_refused_naming_them(hw, options, message):
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            pass

    with pytest.raises(hw.HookError, match=message):
        Loop().before("step", lambda self: None, **options)
    with pytest.raises(hw.HookError, match=message):
        hw.before(Loop, "step", lambda self: None, **options)


def test_a_callback_ordered_against_itself_is_refused(hw):
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            pass

    def log(self: Any) -> None:
        pass

    with pytest.raises(hw.HookError, match="is ordered before= or after= itself"):
        Loop().before("step", log, before=log)


def test_a_callback_object_with_a_non_callable_event_attribute_is_refused(hw):
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            pass

    class Broken(hw.Callback):
        pre_step = 42

    with pytest.raises(hw.HookError, match=r"Broken\.pre_step is named like an event method but is a int"):
        Loop().add_callback(Broken())

    class Base(hw.Callback):
        def pre_step(self, loop: Any) -> None:
            raise AssertionError("turned off by the subclass")

    class Quiet(Base):
        pre_step = None  # turns the base's method off

    Loop().add_callback(Quiet())


def test_a_bad_rank_in_the_environment_is_refused_naming_it(hw, monkeypatch):
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            pass

    monkeypatch.setenv("RANK", "abc")
    loop = Loop()
    loop.before("step", lambda self: None, rank_zero_only=True)
    with pytest.raises(hw.HookError, match="RANK='abc' in the environment is not a process rank"):
        loop.step()


@pytest.mark.parametrize("value, pure", [("0", False), ("false", False), ("no", False), ("", False),
                                         ("1", True), ("yes", True)])
def test_hookwrap_no_extensions_reads_false_values_as_false(value, pure):
    import subprocess
    import sys

    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS=value)
    out = subprocess.run([sys.executable, "-c", "import hookwrap._dispatch as d; print(d.NO_EXTENSIONS)"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(pure)


def test_a_post_callback_returning_an_argument_is_told_it_cannot_replace_it(hw):
    """Audit item 19: it was told it 'takes no arguments'."""
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self, batch: int) -> int:
            return batch

    loop = Loop()
    loop.after("step", lambda self, batch: batch)
    with pytest.raises(hw.CallbackReturnError,
                       match=r"a post callback reads the arguments \('batch'\) but cannot replace them"):
        loop.step(1)


def test_a_returned_value_with_a_broken_repr_does_not_hide_the_error(hw):
    """Audit item 14 (second half)."""
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            pass

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    loop = Loop()
    loop.before("step", lambda self: Broken())
    with pytest.raises(hw.CallbackReturnError, match="returned a Broken .<Broken whose repr raised RuntimeError>."):
        loop.step()


def test_registering_on_an_object_without_join_points_names_the_fix(hw):
    """Audit item 20: it suggested registering on `object`."""
    class Plain:
        def step(self) -> None:
            pass

    with pytest.raises(hw.UnknownEventError, match=r"object has no join points; it is a built-in type"):
        hw.before(object(), "step", lambda self: None)
    with pytest.raises(hw.UnknownEventError, match=r"Plain has no join points; .*hookwrap\.weave\(.*Plain, 'step'\)"):
        hw.before(Plain(), "step", lambda self: None)
    assert "__hookwrap__" not in vars(Plain) and "__hookwrap_class__" not in vars(Plain)


def test_a_join_point_called_with_a_foreign_self_runs_as_the_plain_method(hw):
    """Audit item 20: H.m(other, ...) refused, or wrote hookwrap's attributes into other's class."""
    class H(hw.Hookable):
        @hw.hookable
        def m(self, x: int) -> int:
            return x

    class Other:
        pass

    hw.before(H, "m", lambda self, x: x + 1)
    assert H.m(object(), 1) == 1 and H.m(Other(), 1) == 1  # as `def m` alone would
    assert "__hookwrap_class__" not in vars(Other) and "__hookwrap__" not in vars(Other)
    assert H().m(1) == 2


def test_an_unknown_event_names_weave_as_the_fix_for_code_you_cannot_edit(hw):
    class Plain:
        def loss(self, x):
            return x

    hw.weave(Plain, "loss")
    with pytest.raises(hw.UnknownEventError) as info:
        hw.before(Plain, "los", lambda self, x: x)
    message = str(info.value)
    assert "Did you mean 'loss'?" in message
    assert "@hookwrap.hookable, or, in code you cannot edit, hookwrap.weave(Plain, 'los')." in message



def test_the_same_callback_object_attached_twice_to_the_same_target_is_refused(hw):
    """Its methods would run twice a call (a notebook cell run again): refused on the
    instance, the class and a function, naming the fix; after its handle's remove()
    it attaches again, and another object of the same class is another callback."""
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            pass

    @hw.hookable
    def loss(x: float) -> float:
        return x

    class Counter(hw.Callback):
        def __init__(self) -> None:
            self.calls = 0

        def post_step(self, obj: Any) -> None:
            self.calls += 1

    class LossCounter(hw.Callback):
        def post_loss(self, x: float) -> None:
            pass

    trainer = Trainer()
    for target, cb in ((trainer, Counter()), (Trainer, Counter()), (loss, LossCounter())):
        handle = hw.add_callback(target, cb)
        with pytest.raises(hw.HookError, match=r"attached to .* already: attached again, each of its methods "
                                                r"would run twice a call.*handle\.remove\(\)"):
            hw.add_callback(target, cb)
        handle.remove()
        hw.add_callback(target, cb).remove()  # after remove(), it attaches again
    counter = Counter()
    trainer.add_callback(counter)
    trainer.add_callback(Counter())  # another object: another callback
    trainer.step()
    assert counter.calls == 1
