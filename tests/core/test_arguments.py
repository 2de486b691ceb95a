"""docs/design/contract.md §2: callbacks get only the arguments they name and return what they take."""

from __future__ import annotations

import pytest


def make_trainer(hw, record):
    class Trainer(hw.Hookable):
        @hw.hookable("loss")
        def compute_loss(self, batch, scale=1.0):
            record.append((batch, scale))
            return batch * scale

    return Trainer()


def test_callback_gets_only_the_arguments_it_names(hw):
    seen = []
    t = make_trainer(hw, [])
    t.before("loss", lambda self: seen.append("nothing"))
    t.before("loss", lambda self, scale: (seen.append(("scale", scale)), scale)[1])
    t.before("loss", lambda self, scale, batch: (seen.append(("both", scale, batch)), (scale, batch))[1])
    t.compute_loss(3)
    assert seen == ["nothing", ("scale", 1.0), ("both", 1.0, 3)]


def test_defaults_are_applied_and_keywords_are_matched(hw):
    seen = []
    t = make_trainer(hw, [])
    t.before("loss", lambda self, batch, scale: (seen.append((batch, scale)), (batch, scale))[1])
    t.compute_loss(2)
    t.compute_loss(2, 5.0)
    t.compute_loss(batch=7, scale=0.5)
    assert seen == [(2, 1.0), (2, 5.0), (7, 0.5)]


def test_replacement_reaches_the_method(hw):
    record = []
    t = make_trainer(hw, record)

    def double(self, batch):
        return batch * 2

    def two(self, batch, scale):
        return batch + 1, scale * 0.5

    t.before("loss", double)
    t.before("loss", two)
    assert t.compute_loss(3) == 3.5
    assert record == [(7, 0.5)]


def test_callback_default_parameter_is_passed_only_if_the_join_point_has_it(hw):
    seen = []
    t = make_trainer(hw, [])

    def cb(self, batch, step=-1, scale=9.0):
        seen.append((batch, step, scale))
        return batch, scale

    t.before("loss", cb)
    t.compute_loss(4, 2.0)
    assert seen == [(4, -1, 2.0)]


def test_keyword_only_callback_parameters(hw):
    seen = []
    t = make_trainer(hw, [])

    def cb(self, *, scale):
        seen.append(scale)
        return scale + 1

    t.before("loss", cb)
    assert t.compute_loss(1, scale=1.0) == 2.0
    assert seen == [1.0]


def test_post_callbacks_read_final_arguments_and_replace_the_result(hw):
    seen = []
    t = make_trainer(hw, [])
    t.before("loss", lambda self, batch: batch + 10)
    t.after("loss", lambda self, batch: seen.append(batch))
    t.after("loss", lambda self, batch, return_value: return_value * 100)
    assert t.compute_loss(1) == 1100.0
    assert seen == [11]


def test_return_contract_none_for_a_consumed_argument(hw):
    t = make_trainer(hw, [])

    def forgot(self, batch):
        print(batch)

    t.before("loss", forgot)
    with pytest.raises(
        hw.CallbackReturnError,
        match=r"callback .*forgot .*for event 'pre-loss' returned None, but it must return the "
        r"value of 'batch'.*Fix: end the callback with `return batch`",
    ):
        t.compute_loss(1)


def test_return_contract_none_is_fine_when_the_value_was_none(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch, mask=None):
            return batch, mask

    t = Trainer()
    t.before("step", lambda self, mask: None)
    assert t.step(1) == (1, None)


def test_return_contract_wrong_count(hw):
    t = make_trainer(hw, [])
    t.before("loss", lambda self, batch, scale: batch)
    with pytest.raises(
        hw.CallbackReturnError,
        match=r"returned a int \(1\), but it must return a tuple of 2 values \(batch, scale\)"
        r".*`return batch, scale`",
    ):
        t.compute_loss(1)


def test_return_contract_value_from_a_callback_that_consumes_nothing(hw):
    t = make_trainer(hw, [])
    t.before("loss", lambda self: 5)
    with pytest.raises(hw.CallbackReturnError, match=r"returned a int \(5\), but it must return None"):
        t.compute_loss(1)


def test_return_contract_post_return_value(hw):
    t = make_trainer(hw, [])
    t.after("loss", lambda self, return_value: None)
    with pytest.raises(hw.CallbackReturnError, match=r"'post-loss' returned None.*'return_value'"):
        t.compute_loss(1)


def test_return_contract_post_without_return_value_must_return_none(hw):
    t = make_trainer(hw, [])
    t.after("loss", lambda self, batch: batch)
    with pytest.raises(hw.CallbackReturnError, match=r"'post-loss' returned a int.*must return None"):
        t.compute_loss(1)


def test_positional_only_var_positional_keyword_only_and_var_keyword_survive(hw):
    received = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, a, /, b, *rest, flag=False, **extra):
            received.append((a, b, rest, flag, extra))
            return a

    t = Trainer()
    t.before("step", lambda self, a: a * 10)
    t.before("step", lambda self, rest: rest + ("added",))
    t.before("step", lambda self, extra: {**extra, "new": 1})
    t.before("step", lambda self, flag: not flag)
    t.step(1, 2, 3, tag="x")
    assert received == [(10, 2, (3, "added"), True, {"tag": "x", "new": 1})]


def test_positional_only_default_is_filled_when_replaced(hw):
    received = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, a=1, b=2, /):
            received.append((a, b))

    t = Trainer()
    t.before("step", lambda self, b: b * 100)
    t.step()
    assert received == [(1, 200)]


def test_args_and_kwargs_join_point_passes_positional_as_positional(hw):
    received = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def forward(self, *args, **kwargs):
            received.append((args, kwargs))

    t = Trainer()
    t.before("forward", lambda self, args, kwargs: (args[::-1], {k.upper(): v for k, v in kwargs.items()}))
    t.forward(1, 2, 3, mode="train")
    assert received == [((3, 2, 1), {"MODE": "train"})]


def test_replacing_var_args_with_the_wrong_type_is_an_error(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def forward(self, *args, **kwargs):
            return args

    t = Trainer()
    t.before("forward", lambda self, kwargs: [1])
    with pytest.raises(hw.CallbackReturnError, match=r"returned a list for \*\*kwargs; return a dict"):
        t.forward(1)
    t.callbacks.clear()
    t.before("forward", lambda self, args: 5)
    with pytest.raises(hw.CallbackReturnError, match=r"returned a int for \*args; return a tuple"):
        t.forward(1)


@pytest.mark.parametrize("replacement, message", [
    ({1: 2}, r"returned a dict for \*\*kwargs with the key 1; keyword arguments are named by strings"),
    ({"x": 5}, r"returned a dict for \*\*kwargs with the key 'x', a parameter of its own; ask for 'x'"),
])
def test_a_kwargs_replacement_that_cannot_be_passed_names_the_callback(hw, replacement, message):
    class Trainer(hw.Hookable):
        @hw.hookable
        def forward(self, x, **kwargs):
            return x, kwargs

    t = Trainer()
    t.before("forward", lambda self, kwargs: replacement)
    for call in (lambda: t.forward(1, a=2), lambda: t.forward(x=1), lambda: t.forward(1)):
        with pytest.raises(hw.CallbackReturnError, match=r"callback .*<lambda> \(.*\) for event 'pre-forward' " + message):
            call()
    t.callbacks.clear()
    t.before("forward", lambda self, kwargs: {"y": 3})
    assert t.forward(1, a=2) == (1, {"y": 3})


def test_exception_in_callback_propagates_unchanged_with_a_note(hw):
    t = make_trainer(hw, [])
    error = KeyError("boom")

    def explode(self, batch):
        raise error

    t.before("loss", explode)
    with pytest.raises(KeyError) as info:
        t.compute_loss(1)
    assert info.value is error
    assert len(info.value.__notes__) == 1
    note = info.value.__notes__[0]
    assert "explode" in note and "test_arguments.py" in note and "'pre-loss'" in note


def test_exception_in_the_method_itself_has_no_note(hw):
    t = make_trainer(hw, [])
    t.before("loss", lambda self, batch: batch)
    with pytest.raises(TypeError) as info:
        t.compute_loss(object())
    assert not getattr(info.value, "__notes__", [])


def test_missing_required_argument_is_reported(hw):
    t = make_trainer(hw, [])
    t.before("loss", lambda self, batch: batch)
    with pytest.raises(TypeError, match=r"asks for argument 'batch' of event 'pre-loss'.*did not pass it"):
        t.compute_loss()


def test_plain_function_callbacks_take_no_self(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        @staticmethod
        def collate(items):
            return list(items)

        callbacks = [("pre-collate", lambda items: tuple(reversed(items)))]

    assert Trainer.collate((1, 2, 3)) == [3, 2, 1]


def test_alternating_call_shapes_give_the_same_answers(hw):
    record = []
    t = make_trainer(hw, record)
    t.before("loss", lambda self, batch, scale: (batch + 1, scale * 2))
    t.after("loss", lambda self, scale, return_value: return_value + scale)
    results = []
    for _ in range(3):
        results.append(t.compute_loss(1))
        results.append(t.compute_loss(1, 3.0))
        results.append(t.compute_loss(batch=1, scale=3.0))
        results.append(t.compute_loss(1, scale=3.0))
    assert results == [6.0, 18.0, 18.0, 18.0] * 3
    assert record == [(2, 2.0), (2, 6.0), (2, 6.0), (2, 6.0)] * 3


def test_replaced_arguments_are_released(hw):
    import gc
    import sys
    import weakref

    class Box:
        pass

    sentinel = Box()
    made = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, a, b):
            return a

    def replace(self, a, b):
        new = Box()
        made.append(weakref.ref(new))
        return new, b

    t = Trainer()
    t.before("step", replace)
    t.before("step", lambda self, a: a)
    before = sys.getrefcount(sentinel)
    for _ in range(200):
        t.step(sentinel, b=sentinel)
    gc.collect()
    assert sys.getrefcount(sentinel) == before
    assert all(ref() is None for ref in made)


def test_keyword_passed_callback_parameters_on_every_path(hw):
    seen = []
    t = make_trainer(hw, [])

    def cb(self, extra=0, *, scale):
        seen.append(scale)
        return scale * 2

    t.before("loss", cb)
    assert t.compute_loss(1, 2.0) == 4.0
    assert t.compute_loss(1, scale=3.0) == 6.0
    assert seen == [2.0, 3.0]


def test_a_callback_signature_is_read_once_per_code_object(hw, monkeypatch):
    import inspect

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch, lr=0.1):
            return batch

    t = Trainer()
    t.step(1)
    reads = []
    real = inspect.signature

    def counting(fn, *args, **kwargs):
        reads.append(getattr(fn, "__qualname__", fn))
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", counting)
    for i in range(50):  # a new closure each time, over one `def`
        def scaled(self, batch, factor=i):
            return batch * factor if factor else batch

        with t.before("step", scaled):
            assert t.step(2) == (2 * i if i else 2)
    assert sum("scaled" in str(r) for r in reads) == 1  # the first registration only


@pytest.mark.parametrize("where", ["pre", "post", "general", "around", "when", "emit", "async"])
def test_an_exception_raised_again_and_again_is_noted_once(hw, where):
    """Audit (issue 21) item 14: an exception object a callback raises on every call
    (a stored one) carries hookwrap's note once, not once per call."""
    import asyncio

    error = KeyError("stored")

    def explode(*args, **kwargs):
        raise error

    class Trainer(hw.Hookable):
        emits = ("on_logged",)

        @hw.hookable
        def step(self, batch):
            return batch

        @hw.hookable
        async def astep(self, batch):
            return batch

    t = Trainer()
    if where == "pre":
        t.before("step", lambda self, batch: explode())
    elif where == "post":
        t.after("step", lambda self, return_value: explode())
    elif where == "general":  # an error callback: the unplanned path
        t.before("step", lambda self, batch: explode())
        t.on_error("step", lambda self, exception: None)
    elif where == "around":
        t.around("step", lambda self, proceed, batch: explode())
    elif where == "when":
        t.before("step", lambda self, batch: batch, when=explode)
    elif where == "emit":
        t.on("on_logged", lambda self: explode())
    else:
        t.before("astep", lambda self, batch: explode())
    for _ in range(5):
        with pytest.raises(KeyError) as info:
            if where == "emit":
                t.emit("on_logged")
            elif where == "async":
                asyncio.run(t.astep(1))
            else:
                t.step(1)
        assert info.value is error
    assert len(error.__notes__) == 1, error.__notes__
