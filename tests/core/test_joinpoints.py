"""docs/design/contract.md §1: what can be a join point, and what it keeps of the function."""

from __future__ import annotations

import asyncio
import inspect
import re

import pytest


def test_method_fires_pre_then_post_around_the_call(hw):
    log = []

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            log.append(("step", batch))
            return batch + 1

        def pre_step_callback(self, batch):
            log.append(("pre", batch))
            return batch

        def post_step_callback(self, return_value):
            log.append(("post", return_value))
            return return_value

    assert Trainer().step(1) == 2
    assert log == [("pre", 1), ("step", 1), ("post", 2)]


def test_explicit_event_name_and_attribute_name(hw):
    seen = []

    class Trainer(hw.Hookable):
        @hw.hookable("loss")
        def compute_loss(self, batch):
            return batch

        @hw.hookable
        def step(self, batch):
            return batch

    t = Trainer()
    t.before("loss", lambda self: seen.append("loss"))
    t.before("step", lambda self: seen.append("step"))
    t.compute_loss(0)
    t.step(0)
    assert seen == ["loss", "step"]
    with pytest.raises(hw.UnknownEventError, match=r"no join point 'compute_loss'.*Did you mean"):
        t.before("compute_loss", lambda self: None)


def test_event_name_is_the_attribute_name_not_the_function_name(hw):
    def shared(self, batch):
        return batch * 3

    class Trainer(hw.Hookable):
        triple = hw.hookable(shared)

    t = Trainer()
    t.after("triple", lambda self, return_value: return_value + 1)
    assert t.triple(2) == 7


def test_plain_function_is_a_join_point_without_self(hw):
    @hw.hookable
    def train_step(model, batch):
        """One step."""
        return (model, batch)

    assert train_step("m", 2) == ("m", 2)
    assert train_step.__name__ == "train_step"
    assert train_step.__doc__ == "One step."
    assert str(inspect.signature(train_step)) == "(model, batch)"


def test_decorated_method_keeps_name_doc_signature_wrapped(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch: int, scale: float = 1.0) -> float:
            """Run one step."""
            return batch * scale

    raw = Trainer.__dict__["step"].__wrapped__
    assert Trainer.step.__name__ == "step"
    assert Trainer.step.__qualname__.endswith("Trainer.step")
    assert Trainer.step.__doc__ == "Run one step."
    assert inspect.signature(Trainer.step) == inspect.signature(raw)
    assert list(inspect.signature(Trainer().step).parameters) == ["batch", "scale"]
    assert Trainer.step.__annotations__ == {"batch": "int", "scale": "float", "return": "float"}
    assert raw.__name__ == "step" and not hasattr(raw, "__wrapped__")
    bound = Trainer().step
    assert bound(2, scale=3) == 6


def test_classmethod_and_staticmethod(hw):
    calls = []

    class Trainer(hw.Hookable):
        @hw.hookable
        @classmethod
        def build(cls, size):
            return (cls.__name__, size)

        @hw.hookable
        @staticmethod
        def helper(x):
            return x * 2

        def pre_build_callback(cls, size):
            calls.append(("pre-build", cls.__name__, size))
            return size + 1

        callbacks = [("post-helper", lambda return_value: return_value + 100)]

    class Child(Trainer):
        pass

    assert Trainer.build(1) == ("Trainer", 2)
    assert Child().build(5) == ("Child", 6)
    assert calls == [("pre-build", "Trainer", 1), ("pre-build", "Child", 5)]
    assert Trainer.helper(3) == 106
    assert Trainer().helper(4) == 108
    assert Trainer.build.__name__ == "build"


def test_async_join_point_with_sync_and_async_callbacks(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        async def step(self, batch):
            await asyncio.sleep(0)
            return batch * 10

    async def pre_async(self, batch):
        await asyncio.sleep(0)
        return batch + 1

    def pre_sync(self, batch):
        return batch + 2

    async def post_async(self, return_value):
        return return_value + 5

    t = Trainer()
    t.before("step", pre_async)
    t.before("step", pre_sync)
    t.after("step", post_async)
    assert inspect.iscoroutinefunction(Trainer.__dict__["step"].__wrapped__)
    assert asyncio.run(t.step(1)) == (1 + 1 + 2) * 10 + 5


def test_async_callback_error_gets_a_note(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        async def step(self, batch):
            return batch

    async def broken(self, batch):
        raise ValueError("bad batch")

    t = Trainer()
    t.before("step", broken)
    with pytest.raises(ValueError, match="bad batch") as info:
        asyncio.run(t.step(1))
    assert any("broken" in note and "'pre-step'" in note for note in info.value.__notes__)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync-callback", "async-callback"])
def test_stop_iteration_from_a_callback_on_an_async_join_point_is_named(hw, asynchronous):
    class Trainer(hw.Hookable):
        @hw.hookable
        async def step(self, batch):
            return batch

    def stops(self, return_value):
        raise StopIteration

    async def stops_async(self, return_value):
        raise StopIteration

    seen = []
    t = Trainer()
    t.after("step", stops_async if asynchronous else stops)
    t.on_error("step", lambda self, exception: seen.append(type(exception).__name__))
    with pytest.raises(RuntimeError, match=r"callback .*stops(_async)? \(.*\) raised StopIteration during "
                                           r"event 'post-step' of an async join point.*PEP 479") as info:
        asyncio.run(t.step(1))
    assert isinstance(info.value.__cause__, StopIteration) and seen == ["RuntimeError"]


def test_init_is_a_join_point(hw):
    log = []

    class Trainer(hw.Hookable):
        def __init__(self, lr=0.1):
            log.append(("init", lr))
            self.lr = lr

        def pre_init_callback(self, lr):
            log.append(("pre-init", lr))
            return lr * 2

        def post_init_callback(self):
            log.append(("post-init", self.lr))

    t = Trainer(lr=0.5)
    assert t.lr == 1.0
    assert log == [("pre-init", 0.5), ("init", 1.0), ("post-init", 1.0)]


def test_init_event_exists_without_an_own_init(hw):
    log = []

    class Trainer(hw.Hookable):
        callbacks = [("post-init", lambda self: log.append(type(self).__name__))]

    Trainer()
    assert log == ["Trainer"]


def test_override_stays_hookable_and_super_fires_once(hw):
    log = []

    class Base(hw.Hookable):
        @hw.hookable("loss")
        def compute_loss(self, batch):
            log.append(("base", batch))
            return batch

        def pre_loss_callback(self, batch):
            log.append(("pre", batch))
            return batch + 1

        def post_loss_callback(self, return_value):
            log.append(("post", return_value))
            return return_value

    class Derived(Base):
        def compute_loss(self, batch):  # not decorated: still the join point 'loss'
            log.append(("derived", batch))
            return super().compute_loss(batch) * 10

    assert Derived().compute_loss(1) == 20
    assert log == [("pre", 1), ("derived", 2), ("base", 2), ("post", 20)]
    log.clear()
    assert Base().compute_loss(1) == 2
    assert log == [("pre", 1), ("base", 2), ("post", 2)]


def test_override_that_redecorates_keeps_the_event_name(hw):
    class Base(hw.Hookable):
        @hw.hookable("loss")
        def compute_loss(self, batch):
            return batch

    class Derived(Base):
        @hw.hookable
        def compute_loss(self, batch):
            return batch * 2

    d = Derived()
    d.after("loss", lambda self, return_value: return_value + 1)
    assert d.compute_loss(3) == 7


def test_init_override_fires_init_callbacks_once(hw):
    log = []

    class Base(hw.Hookable):
        def __init__(self):
            log.append("base init")

        def post_init_callback(self):
            log.append("post-init")

    class Derived(Base):
        def __init__(self):
            super().__init__()
            log.append("derived init")

    Derived()
    assert log == ["base init", "derived init", "post-init"]


def test_hookable_twice_is_idempotent_and_conflicting_names_fail(hw):
    def f(x):
        return x

    once = hw.hookable(f)
    assert hw.hookable(once) is once
    with pytest.raises(hw.HookError, match=r"already a join point; it cannot also be 'other'"):
        hw.hookable("other")(once)


def test_hookable_rejects_non_callables(hw):
    with pytest.raises(hw.HookError, match=r"needs a function or method, got 42.*directly above a `def`"):
        hw.hookable(42)


def test_hookable_method_on_a_plain_class_works_without_callbacks(hw):
    class Plain:
        @hw.hookable
        def step(self, x):
            return x + 1

    assert Plain().step(1) == 2
    assert Plain.step(Plain(), 2) == 3


@pytest.mark.parametrize("called_first", [False, True], ids=["registered-first", "called-first"])
def test_registering_through_a_plain_class_methods_attribute_is_the_class_tier(hw, called_first):
    # Pure twin: a plain (not Hookable) class's join point is stored as a function,
    # which Python never names (no __set_name__), so Plain.step.before(fn)
    # registered on a function whose `self` is an argument: fn had to return
    # (self, x). It registers on the class, as on the compiled twin.
    class Plain:
        @hw.hookable
        def step(self, x):
            return x + 1

    obj = Plain()
    if called_first:
        assert obj.step(1) == 2
    seen: list[tuple[str, int]] = []

    def fn(self, x):
        seen.append((type(self).__name__, x))
        return x * 10

    handle = Plain.step.before(fn)
    assert obj.step(2) == 21 and Plain().step(3) == 31
    assert seen == [("Plain", 2), ("Plain", 3)]
    assert "Plain" in str(hw.describe(Plain, "step"))
    handle.remove()
    assert obj.step(2) == 3


def test_callable_object_join_point(hw):
    class Scale:
        def __call__(self, x):
            return x * 4

    scaled = hw.hookable(Scale())
    assert scaled(2) == 8


def test_compiled_call_with_nothing_registered_allocates_nothing(hw):
    import tracemalloc

    if not hw.USING_EXTENSION:
        pytest.skip("the pure twin's dispatch function takes **kwargs: a dict on every call")

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch, scale=1):
            return batch

        def bare(self, batch, scale=1):
            return batch

    @hw.hookable
    def train_step(batch):
        return batch

    def bare_function(batch):
        return batch

    t, batch = Trainer(), [1, 2]

    def peak_of(calls):
        for _ in range(10):  # warm: chains resolved, caches filled
            calls()
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            for _ in range(1000):
                calls()
            return tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()

    def bare_calls():
        t.bare(batch)
        t.bare(batch, scale=2)
        bare_function(batch)

    def hooked_calls():
        t.step(batch)
        t.step(batch, scale=2)
        train_step(batch)

    # Whatever the loop itself allocates, the hooked calls add nothing to it.
    assert peak_of(hooked_calls) == peak_of(bare_calls)


@pytest.mark.parametrize("name", ["pre-loss", "post-step", "", "-x"])
def test_hookable_refuses_event_strings_as_join_point_names(hw, name):
    with pytest.raises(hw.HookError, match=r"give the join point name, like 'loss'"):
        hw.hookable(name)(lambda self: None)


def test_join_point_names_that_are_phase_words_are_fine(hw):
    class Trainer(hw.Hookable):
        @hw.hookable("error")
        def report_error(self, x):
            return x

    t = Trainer()
    t.after("error", lambda self, return_value: return_value + 1)
    assert t.report_error(1) == 2


def test_introspection_an_async_join_point_is_a_coroutine_function_and_reprs_match(hw):
    """Audit (issue 21) item 25: inspect.iscoroutinefunction sees an async join
    point as the function it wraps, and a join point's repr names the function,
    alike in both twins (as the function's own repr: ``<function T.step at 0x...>``)."""

    class Trainer(hw.Hookable):
        @hw.hookable
        async def fit(self, n):
            return n

        @hw.hookable
        def step(self, batch):
            return batch

    @hw.hookable
    async def free(n):
        return n

    t = Trainer()
    for fn in (Trainer.fit, t.fit, free, Trainer.__dict__["fit"]):
        assert inspect.iscoroutinefunction(fn), fn
    for fn in (Trainer.step, t.step, Trainer.__dict__["step"]):
        assert not inspect.iscoroutinefunction(fn), fn
    assert asyncio.run(t.fit(3)) == 3 and asyncio.run(free(4)) == 4
    with pytest.raises(TypeError):  # a call the function refuses fails at once, as it would
        t.fit()
    qualname = Trainer.step.__qualname__
    assert qualname.endswith("<locals>.Trainer.step")
    for jp, name in ((Trainer.__dict__["step"], qualname), (Trainer.__dict__["fit"], qualname[:-4] + "fit"),
                     (free, free.__qualname__)):
        assert re.fullmatch(rf"<function {re.escape(name)} at 0x[0-9a-f]+>", repr(jp)), repr(jp)
    assert repr(t.step).startswith(f"<bound method {qualname} of ")
