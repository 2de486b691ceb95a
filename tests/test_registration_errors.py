"""Bad callbacks fail at registration, naming the callback, the event and the fix."""

from __future__ import annotations

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
