"""hookwrap.integrations.arctic_training: ArcticTraining's (0.8) CallbackMixin and
callback_wrapper semantics on hookwrap's dispatch, each checked here on its own
(what ArcticTraining's code does is cited per test), and its bad input. No `from __future__ import annotations` here: ArcticTraining reads
`-> None` as the object None (see test_a_string_none_annotation_is_a_value)."""

import importlib
import inspect
import logging
import pickle
from abc import ABC, abstractmethod
from typing import Any

import pytest


@pytest.fixture
def at(hw: Any) -> Any:
    return importlib.import_module("hookwrap.integrations.arctic_training")


# --- join points ------------------------------------------------------------------


def test_callback_wrapper_names_the_events_and_marks_the_method(at: Any, hw: Any) -> None:
    class T(at.CallbackMixin):
        @at.callback_wrapper("multi-args")
        def multi_args(self, val1: int, val2: int) -> int:
            """Docstring kept."""
            return val1 * val2

        def pre_multi_args_callback(self, val1: int, val2: int) -> tuple[int, int]:
            return val1 * 3, val2 * 5

    assert T().multi_args(2, 2) == 6 * 10
    assert T.multi_args.__at_wrapped_name__ == "multi-args"
    assert T.multi_args.__doc__ == "Docstring kept."
    assert hw.extend.is_join_point(vars(T)["multi_args"])
    again = at.callback_wrapper("other")(vars(T)["multi_args"])  # already wrapped: unchanged
    assert again is vars(T)["multi_args"]


def test_an_abstract_method_overridden_undecorated_stays_wrapped(at: Any) -> None:
    # ArcticTraining re-wraps an override of a wrapped method in __init_subclass__.
    class Base(ABC, at.CallbackMixin):
        @abstractmethod
        @at.callback_wrapper("abstract")
        def abstract(self, val: int) -> int: ...

    class Sub(Base):
        callbacks = [("pre-abstract", lambda self, val: val + 1), ("post-abstract", lambda self, r: r * 10)]

        def abstract(self, val: int) -> int:
            return val**2

    class SubSub(Sub):
        def abstract(self, val: int) -> int:
            return val**3

    with pytest.raises(TypeError, match="abstract"):
        Base()
    assert Sub().abstract(2) == 9 * 10
    assert SubSub().abstract(2) == 27 * 10


def test_init_is_a_join_point_and_overrides_of_it_too(at: Any) -> None:
    seen: list[Any] = []

    class T(at.CallbackMixin):
        def __init__(self, cfg: str, mode: str = "train") -> None:
            self.cfg, self.mode = cfg, mode

        def pre_init_callback(self, cfg: str) -> str:
            return cfg + "!"

        def post_init_callback(self) -> None:
            seen.append(self.cfg)

    assert T("c").mode == "train" and seen == ["c!"]


def test_init_arguments_do_not_reach_object(at: Any) -> None:
    # ArcticTraining's own pre-init callback drops `args`/`kwargs`, so a class without
    # an __init__ of its own takes any arguments, as there.
    class T(at.CallbackMixin):
        pass

    assert isinstance(T(1, a=2), T)


# --- pre callbacks -------------------------------------------------------------------


def test_pre_callbacks_return_one_value_several_or_nothing(at: Any) -> None:
    class T(at.CallbackMixin):
        val = 16
        callbacks = [
            ("pre-none", lambda self: setattr(self, "val", self.val + 123)),
            ("pre-one", lambda self, val: val * 12),
            ("pre-two", lambda self, b, a: (b + 1, a * 100)),  # its own parameter order
        ]

        @at.callback_wrapper("none")
        def none(self) -> int:
            return self.val

        @at.callback_wrapper("one")
        def one(self, val: int) -> int:
            return val * 10

        @at.callback_wrapper("two")
        def two(self, a: int, b: int) -> int:
            return a - b

    t = T()
    assert t.none() == 139
    assert t.one(2) == 240
    assert t.two(1, 2) == 100 - 3


def test_a_pre_callback_may_set_an_argument_to_none(at: Any) -> None:
    # ArcticTraining passes on whatever a one-argument callback returns, None too
    # (hw.Hookable refuses None for a value that was not None).
    class T(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self, lr: float | None) -> Any:
            return lr

        def pre_step_callback(self, lr: float) -> None:
            return None

    assert T().step(0.1) is None


def test_a_sequence_return_other_than_a_tuple_is_taken(at: Any) -> None:
    class T(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self, a: int, b: int) -> int:
            return a - b

        def pre_step_callback(self, a: int, b: int) -> list[int]:
            return [b, a]

    assert T().step(1, 2) == 1


def test_after_a_pre_callback_the_method_gets_keywords_without_args_and_kwargs(at: Any) -> None:
    # ArcticTraining binds the call to the method's signature, applies the defaults
    # and calls it with keywords only, leaving out parameters named args and kwargs.
    seen: list[Any] = []

    class T(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self, a: int, b: int = 2, *args: Any, **kwargs: Any) -> int:
            seen.append((a, b, args, kwargs))
            return a

        def pre_step_callback(self, b: int) -> int:
            return b * 10

    T().step(1, 3, 4, x=5)
    assert seen == [(1, 30, (), {})]

    class Plain(at.CallbackMixin):  # no pre callback: the call goes through as made
        @at.callback_wrapper("step")
        def step(self, a: int, *args: Any, **kwargs: Any) -> Any:
            return a, args, kwargs

    assert Plain().step(1, 2, x=3) == (1, (2,), {"x": 3})


# --- post callbacks ------------------------------------------------------------------


def test_post_callbacks_take_the_value_under_any_name_and_replace_it(at: Any) -> None:
    class T(at.CallbackMixin):
        @at.callback_wrapper("loss")
        def loss(self, x: float) -> float:
            return x

        def post_loss_callback(self, whatever_name: float) -> float:
            return whatever_name * 2

    assert T().loss(3) == 6


def test_a_post_callback_returning_none_makes_the_value_none(at: Any) -> None:
    class T(at.CallbackMixin):
        @at.callback_wrapper("loss")
        def loss(self, x: float) -> float:
            return x

        def post_loss_callback(self, value: float) -> None:
            pass

    assert T().loss(3) is None


def test_post_callbacks_of_a_none_method_take_only_self(at: Any) -> None:
    seen: list[int] = []

    class T(at.CallbackMixin):
        @at.callback_wrapper("no-out")
        def no_out(self, val: int) -> None:
            self.val = val + 42

        def post_no_out_callback(self) -> int:
            seen.append(self.val)
            return 7  # as in ArcticTraining, it becomes what the call returns

    assert T().no_out(1) == 7 and seen == [43]


def test_a_method_without_a_return_annotation_passes_the_value(at: Any) -> None:
    # ArcticTraining checks nothing then (it logs a warning) and passes the value.
    class T(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self):  # type: ignore[no-untyped-def]
            return 1

        def post_step_callback(self, r: int) -> int:
            return r + 1

    assert T().step() == 2


def test_a_string_none_annotation_is_a_value(at: Any) -> None:
    # Under `from __future__ import annotations`, `-> None` is the string "None":
    # ArcticTraining compares with `is None`, so its post callbacks take the value
    # (None). So do they here, so that such a module's callbacks keep working.
    space: dict[str, Any] = {"at": at}
    exec("from __future__ import annotations\n"
         "class T(at.CallbackMixin):\n"
         "    @at.callback_wrapper('step')\n"
         "    def step(self) -> None: ...\n"
         "    def post_step_callback(self, value): return ('got', value)\n", space)
    assert space["T"]().step() == ("got", None)


def test_a_post_event_whose_name_holds_pre_is_a_post_callback(at: Any) -> None:
    # ArcticTraining tests `"pre" in event`, which makes post-predict a pre callback
    # (refused: its parameter is no argument of predict). Here the prefix decides.
    class T(at.CallbackMixin):
        @at.callback_wrapper("predict")
        def predict(self, x: int) -> int:
            return x

        def post_predict_callback(self, r: int) -> int:
            return r * 2

    assert T().predict(3) == 6


# --- where callbacks come from, and their order ---------------------------------------


def test_lists_accumulate_along_the_classes_without_duplicates(at: Any) -> None:
    log: list[str] = []

    def cb(self: Any) -> None:
        log.append("cb")

    class A(at.CallbackMixin):
        callbacks = [("pre-step", cb)]

        @at.callback_wrapper("step")
        def step(self) -> None:
            log.append("step")

    class B(A):
        callbacks = [*A.callbacks, ("pre-step", lambda self: log.append("B"))]

    class C(B):
        pass

    C().step()
    assert log == ["cb", "B", "step"]


def test_order_pre_in_declaration_order_then_the_method_then_post(at: Any) -> None:
    log: list[Any] = []

    class T(at.CallbackMixin):
        callbacks = [
            ("post-step", lambda self, r: log.append(("list post", r)) or r + 1),
            ("pre-step", lambda self, x: log.append(("list pre", x)) or x + 1),
        ]

        @at.callback_wrapper("step")
        def step(self, x: int) -> int:
            log.append(("step", x))
            return x

        def post_step_callback(self, r: int) -> int:
            log.append(("method post", r))
            return r * 10

        def pre_step_callback_2(self, x: int) -> int:  # ArcticTraining: a pre-step callback too
            log.append(("method pre 2", x))
            return x

        def pre_step_callback(self, x: int) -> int:  # methods run by name
            log.append(("method pre", x))
            return x

    assert T().step(1) == 30
    assert log == [("list pre", 1), ("method pre", 2), ("method pre 2", 2), ("step", 2),
                   ("list post", 2), ("method post", 3)]


def test_a_base_may_name_an_event_only_its_subclasses_have(at: Any) -> None:
    log: list[str] = []

    class A(at.CallbackMixin):
        callbacks = [("pre-train", lambda self: log.append("A list"))]

    class B(A):
        @at.callback_wrapper("train")
        def train(self) -> None:
            log.append("train")

    class C(B):
        pass

    C().train()
    B().train()
    assert log == ["A list", "train"] * 2
    with pytest.raises(at.ArcticCallbackError, match="pre-train"):
        A()  # as ArcticTraining: refused when instantiated


def test_super_calls_run_the_callbacks_once(at: Any) -> None:
    # A difference: ArcticTraining's base wrapper runs them again inside super().
    log: list[int] = []

    class A(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self, x: int) -> int:
            return x

        def pre_step_callback(self, x: int) -> int:
            log.append(x)
            return x + 1

    class B(A):
        def step(self, x: int) -> int:
            return super().step(x)

    assert B().step(1) == 2 and log == [1]


def test_hookwrap_callbacks_and_describe_work_on_the_same_join_points(at: Any, hw: Any) -> None:
    class T(at.CallbackMixin):
        callbacks = [("pre-loss", lambda self, batch: batch * 2)]

        @at.callback_wrapper("loss")
        def loss(self, batch: float) -> float:
            return batch + 0.5

        def post_loss_callback(self, loss: float) -> float:
            return loss * 10

    t = T()
    seen: list[float] = []
    with hw.after(t, "loss", lambda self, return_value: seen.append(return_value) or return_value):
        assert t.loss(1) == 25.0
    assert seen == [25.0]
    text = str(hw.describe(t, "loss"))
    assert "T.post_loss_callback" in text and "<locals>.T (registered)" in text


def _double(self: Any, x: int) -> int:
    return x * 2


def test_hookwrap_callbacks_run_outside_the_arctic_training_ones(at: Any, hw: Any) -> None:
    log: list[str] = []

    class T(at.CallbackMixin):
        callbacks = [("pre-loss", lambda self, x: log.append("AT pre") or x),
                     ("post-loss", lambda self, r: log.append("AT post") or r + 1)]

        @at.callback_wrapper("loss")
        def loss(self, x: int) -> int:
            return x

    t = T()
    hw.before(t, "loss", lambda self, x: log.append("hw before") or x)
    hw.after(t, "loss", lambda self, return_value: log.append(f"hw after {return_value}") or return_value)
    hw.before(T, "loss", lambda self, x: log.append("hw class before") or x)
    assert t.loss(1) == 2
    assert log == ["hw class before", "hw before", "AT pre", "AT post", "hw after 2"]


def test_every_base_adds_its_callbacks(at: Any) -> None:
    # A difference: ArcticTraining reads the first base's accumulated list only.
    log: list[str] = []

    class Base(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self) -> None:
            log.append("step")

    class A(Base):
        callbacks = [("pre-step", lambda self: log.append("A"))]

    class B(Base):
        callbacks = [("pre-step", lambda self: log.append("B"))]

    class C(A, B):
        pass

    C().step()
    assert log == ["B", "A", "step"]  # reverse MRO, as hookwrap's class tier


def test_dash_and_underscore_compare_alike(at: Any) -> None:
    class T(at.CallbackMixin):
        callbacks = [("pre-multi-args", lambda self, a: a + 1)]

        @at.callback_wrapper("multi_args")
        def multi_args(self, a: int) -> int:
            return a

        def pre_multi_args_callback(self, a: int) -> int:
            return a * 10

    assert T().multi_args(1) == 20


def test_objects_pickle_and_copy(at: Any) -> None:
    import copy

    class T(at.CallbackMixin):
        callbacks = [("pre-loss", _double)]

        @at.callback_wrapper("loss")
        def loss(self, x: int) -> int:
            return x * 2

    T.__qualname__ = "_PickledTrainer"  # found by name when unpickled
    globals()["_PickledTrainer"] = T
    t = T()
    assert pickle.loads(pickle.dumps(t)).loss(1) == 4
    assert copy.deepcopy(t).loss(1) == 4


# --- what ArcticTraining's own code reads: its log callbacks, its Ray launcher ------------


class _ATCallback:
    """ArcticTraining's Callback as its _run_callbacks calls it (callback/callback.py):
    cb(obj, args, kwargs) -> (args, kwargs); a pre one returns the method's arguments
    as keywords, a post one the value. Its Ray launcher adds these to a trainer."""

    def __init__(self, event: str, fn: Any, method: Any) -> None:
        self.event, self.fn, self.method = event, fn, method

    def __call__(self, obj: Any, args: Any, kwargs: Any) -> Any:
        if self.event.startswith("pre-"):
            bound = inspect.signature(self.method).bind(obj, *args, **kwargs)
            call = {k: v for k, v in bound.arguments.items() if k != "self"}
            names = list(inspect.signature(self.fn).parameters)[1:]
            returned = self.fn(obj, **{n: call[n] for n in names})
            call.update(zip(names, (returned,) if len(names) == 1 else returned or ()))
            return (), call
        return self.fn(obj, args), {}

    def __repr__(self) -> str:
        return f"<Callback event={self.event} fn={self.fn.__name__}>"


def test_the_default_callbacks_log_arctic_training_s_lines(at: Any, caplog: pytest.LogCaptureFixture) -> None:
    # ArcticTraining's CallbackMixin.callbacks (callback/mixin.py, callback/logging.py):
    # three INFO lines per instance; a class declaring its own list has none of them.
    assert at.CallbackMixin.callbacks == [at.pre_init_log_cb, at.post_init_log_cb,
                                          at.post_init_callback_ordering_cb]

    class Factory(at.CallbackMixin):
        @at.callback_wrapper("load")
        def load(self, x: int) -> int:
            return x

        def pre_load_callback(self, x: int) -> int:
            return x + 1

    class Listed(at.CallbackMixin):
        callbacks = [("pre-init", lambda self: None)]

    with caplog.at_level(logging.INFO, logger="hookwrap.integrations.arctic_training"):
        assert Factory().load(1) == 2
        Listed()
    assert [(r.name, r.levelname) for r in caplog.records] == [("hookwrap.integrations.arctic_training", "INFO")] * 3
    first, second, ordering = (r.getMessage() for r in caplog.records)
    assert (first, second) == ("Initializing Factory", "Initialized Factory")
    assert ordering.startswith("Callback methods for Factory:")
    assert "  load:\n\tPre-callbacks:[<Callback event=pre-load fn=pre_load_callback>]\n\tPost-callbacks:[]" in ordering
    assert ("  init:\n\tPre-callbacks:[<Callback event=pre-init fn=_pre_init_log>]\n\tPost-callbacks:"
            "[<Callback event=post-init fn=_post_init_log>, <Callback event=post-init fn=_log_callback_ordering>]"
            in ordering)


def test_with_the_defaults_an_unannotated_init_fails_as_in_arctic_training(at: Any) -> None:
    # ArcticTraining passes the post-init log callback the value of an unannotated
    # __init__, which it does not take: annotate `-> None`.
    class T(at.CallbackMixin):
        def __init__(self, cfg):  # type: ignore[no-untyped-def]
            self.cfg = cfg

    with pytest.raises(TypeError):
        T("c")


def test_get_all_callback_event_methods_is_arctic_training_s(at: Any) -> None:
    class T(at.CallbackMixin):
        @at.callback_wrapper("multi-args")
        def multi(self, a: int, b: int) -> int:
            return a

    class U(T):
        def multi(self, a: int, b: int) -> int:  # re-wrapped: U's is the method
            return b

    methods = U._get_all_callback_event_methods()
    assert list(methods) == ["pre-init", "post-init", "pre-multi-args", "post-multi-args"]  # by attribute
    assert methods["pre-multi-args"] is methods["post-multi-args"] is U.multi
    assert list(inspect.signature(methods["post-multi-args"]).parameters) == ["self", "a", "b"]
    assert U()._get_all_callback_event_methods() == methods


def test_initialized_callbacks_lists_the_class_s_in_the_order_they_run(at: Any) -> None:
    def listed(self: Any, x: int) -> int:
        return x

    class T(at.CallbackMixin):
        callbacks = [("post-step", lambda self, r: r), ("pre-step", listed)]

        @at.callback_wrapper("step")
        def step(self, x: int) -> int:
            return x

        def pre_step_callback(self, x: int) -> int:
            return x

    with pytest.raises(at.HookError, match="made when the class is instantiated"):
        T._initialized_callbacks.extend([])
    t = T()
    assert isinstance(t._initialized_callbacks, list) and t._initialized_callbacks is T._initialized_callbacks
    assert [(cb.event, cb.fn.__name__) for cb in t._initialized_callbacks] == [
        ("post-step", "<lambda>"), ("pre-step", "listed"), ("pre-step", "pre_step_callback")]


def test_the_ray_launcher_s_callbacks_run_on_the_class_s_objects(at: Any) -> None:
    # arctic_training/launcher/ray_launcher.py, _attach_ray_callbacks: Callback objects
    # made of _get_all_callback_event_methods(), added with _initialized_callbacks.extend.
    log: list[Any] = []

    class Trainer(at.CallbackMixin):
        callbacks = [("post-step", lambda self: log.append("own post-step"))]

        @at.callback_wrapper("step")
        def step(self, batch: list[int]) -> None:
            log.append(["step", batch])

        @at.callback_wrapper("loss")
        def loss(self, batch: list[int]) -> int:
            return sum(batch)

    class Sub(Trainer):
        pass

    trainer, sub = Trainer(), Sub()
    methods = trainer._get_all_callback_event_methods()
    trainer._initialized_callbacks.extend([
        _ATCallback("post-step", lambda self, value: log.append("ray report"), methods["post-step"]),
        _ATCallback("pre-loss", lambda self, batch: [x * 2 for x in batch], methods["pre-loss"])])
    trainer._initialized_callbacks.append(_ATCallback("post-loss", lambda self, v: v + 1, methods["post-loss"]))
    assert repr(trainer._initialized_callbacks[-3]) == "<Callback event=post-step fn=<lambda>>"
    trainer.step([1])
    assert log == [["step", [1]], "own post-step", "ray report"]
    assert trainer.loss([1, 2]) == 7
    assert sub.loss([1, 2]) == 3  # Sub's objects have Sub's list, as in ArcticTraining
    Trainer()  # ArcticTraining makes the class's list anew: what was added stops running
    assert trainer.loss([1, 2]) == 3 and len(trainer._initialized_callbacks) == 1


def test_initialized_callbacks_takes_arctic_training_callbacks_only_and_additions_only(at: Any) -> None:
    class T(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self) -> None: ...

    t = T()
    with pytest.raises(at.ArcticCallbackError, match=r"Callback\(event, fn, method\).*hw.before"):
        t._initialized_callbacks.append(("post-step", lambda self: None))
    with pytest.raises(ValueError, match=r"'post-stpe'.*names no method.*'post-step'"):
        t._initialized_callbacks.extend([_ATCallback("post-stpe", lambda self: None, T.step)])
    for change in (lambda cbs: cbs.clear(), lambda cbs: cbs.insert(0, None), lambda cbs: cbs.pop(),
                   lambda cbs: cbs.__setitem__(0, None), lambda cbs: cbs.__iadd__([])):
        with pytest.raises(at.HookError, match=r"append\(\) and extend\(\) only"):
            change(t._initialized_callbacks)
    assert len(t._initialized_callbacks) == 3  # nothing of it was added


# --- bad input ------------------------------------------------------------------------


def test_a_callback_for_no_wrapped_method_is_refused_when_instantiated(at: Any) -> None:
    class T(at.CallbackMixin):  # ArcticTraining: ValueError when instantiated
        callbacks = [("pre-stpe", lambda self: None)]

        @at.callback_wrapper("step")
        def step(self) -> None: ...

    with pytest.raises(ValueError, match=r"'pre-stpe'.*names no method.*'pre-step'"):
        T()


def test_a_callback_method_for_no_wrapped_method_is_refused(at: Any) -> None:
    class T(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self) -> None: ...

        def post_stpe_callback(self) -> None: ...

    with pytest.raises(at.ArcticCallbackError, match="post-stpe"):
        T()


@pytest.mark.parametrize("item, message", [
    (("pre-step", 42), "42, which is not callable"),
    (("around-step", lambda self: None), "not an ArcticTraining event"),
    (("step", lambda self: None), "not an ArcticTraining event"),
    ("pre-step", r"an \(event, callback\) pair"),
])
def test_malformed_entries_are_refused_when_the_class_is_made(at: Any, item: Any, message: str) -> None:
    # ArcticTraining fails later, at the first instance (an AttributeError for 42).
    with pytest.raises(at.ArcticCallbackError, match=message):
        class T(at.CallbackMixin):
            callbacks = [item]

            @at.callback_wrapper("step")
            def step(self) -> None: ...


def test_callbacks_must_be_a_list(at: Any) -> None:
    with pytest.raises(at.ArcticCallbackError, match="must be a list"):
        class T(at.CallbackMixin):
            callbacks = None  # type: ignore[assignment]


def test_a_callable_without_a_name_is_taken(at: Any) -> None:
    # ArcticTraining reads fn.__name__ (an AttributeError for a callable object);
    # here it runs.
    class Scale:
        def __call__(_, self: Any, x: int) -> int:  # noqa: N805
            return x * 3

    class T(at.CallbackMixin):
        callbacks = [("pre-step", Scale())]

        @at.callback_wrapper("step")
        def step(self, x: int) -> int:
            return x

    assert T().step(2) == 6


@pytest.mark.parametrize("callback, message", [
    ("def cb(self, z): return z", "takes 'z', which step"),
    ("def cb(self, a=1): return a", "default"),
    ("def cb(self, *a): return a", r"takes \*a"),
    ("def cb(): return None", "takes no parameter"),
    ("def cb(trainer, a): return a", "first parameter.*name it `self`"),
])
def test_pre_callback_signatures_are_checked_when_instantiated(at: Any, callback: str, message: str) -> None:
    space: dict[str, Any] = {}
    exec(callback, space)

    class T(at.CallbackMixin):
        callbacks = [("pre-step", space["cb"])]

        @at.callback_wrapper("step")
        def step(self, a: int) -> int:
            return a

    with pytest.raises(ValueError, match=message):
        T()


def test_post_callback_parameter_counts_are_checked(at: Any) -> None:
    class Returns(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self) -> int:
            return 1

        def post_step_callback(self) -> int:
            return 1

    class ReturnsNone(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self) -> None: ...

        def post_step_callback(self, value: Any) -> None: ...

    with pytest.raises(at.ArcticCallbackError, match="takes two"):
        Returns()
    with pytest.raises(at.ArcticCallbackError, match="takes only `self`"):
        ReturnsNone()


def test_pre_callback_returns_are_checked(at: Any, hw: Any) -> None:
    class T(at.CallbackMixin):
        @at.callback_wrapper("two")
        def two(self, a: int, b: int) -> int:
            return a + b

        @at.callback_wrapper("zero")
        def zero(self) -> int:
            return 0

        def pre_two_callback(self, a: int, b: int) -> Any:
            return self.answer

        def pre_zero_callback(self) -> int:
            return 1

    t = T()
    t.answer = (1, 2, 3)
    with pytest.raises(at.ArcticCallbackError, match="returned 3 values for 2"):
        t.two(1, 2)
    t.answer = 1
    with pytest.raises(hw.CallbackReturnError, match="return a, b"):  # TypeError, as there
        t.two(1, 2)
    with pytest.raises(at.ArcticCallbackError, match="return nothing"):
        t.zero()


def test_appending_to_callbacks_later_is_refused(at: Any) -> None:
    # ArcticTraining appends to the class's list, which no existing class reads again.
    class T(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self) -> None: ...

    with pytest.raises(at.HookError, match="read when the class is created"):
        T().callbacks.append(("pre-step", lambda self: None))
    with pytest.raises(at.HookError, match="read when the class is created"):
        at.CallbackMixin.callbacks.append(("pre-step", lambda self: None))


def test_callback_wrapper_refuses_a_bad_name_or_target(at: Any) -> None:
    with pytest.raises(at.HookError, match="non-empty string"):
        at.callback_wrapper("")
    with pytest.raises(at.HookError, match="non-empty string"):
        at.callback_wrapper(3)
    with pytest.raises(at.HookError, match="decorates a method"):
        at.callback_wrapper("step")(42)


# --- ArcticTraining's documentation (docs/callbacks.rst), its examples --------------------


def test_the_at_docs_examples(at: Any, capsys: pytest.CaptureFixture[str]) -> None:
    class Trainer(at.CallbackMixin):
        @at.callback_wrapper("step")
        def step(self, batch: list[int]) -> None: ...

        @at.callback_wrapper("loss")
        def loss(self, batch: list[int]) -> float:
            return float(sum(batch))

        @at.callback_wrapper("epoch")
        def epoch(self) -> None:
            self.step([1])

    # "Callback Functions"
    def pre_loss_callback_1(self: Any) -> None:
        print("Loss callback triggered")

    def pre_loss_callback_2(self: Any, batch: Any) -> Any:
        print(f"Loss callback triggered with batch {batch}")
        return batch

    def post_loss_callback(self: Any, return_value: Any) -> Any:
        print(f"Loss callback triggered with return value {return_value}")
        return return_value

    class LossTrainer(Trainer):
        callbacks = [("pre-loss", pre_loss_callback_1), ("pre-loss", pre_loss_callback_2),
                     ("post-loss", post_loss_callback)]

    assert LossTrainer().loss([1, 2]) == 3.0
    assert capsys.readouterr().out.splitlines() == [
        "Loss callback triggered", "Loss callback triggered with batch [1, 2]",
        "Loss callback triggered with return value 3.0"]

    # "Adding Callbacks": a list entry, and the equivalent method
    def pre_step_callback(self: Any, batch: Any) -> Any:
        print(f"Step callback triggered with batch {batch}")
        return batch

    class MyTrainer(Trainer):
        name = "my_trainer"
        callbacks = [("pre-step", pre_step_callback)]

    class MyTrainer2(Trainer):
        name = "my_trainer"

        def pre_step_callback(self, batch: Any) -> Any:
            print(f"Step callback triggered with batch {batch}")
            return batch

    MyTrainer().step([1])
    MyTrainer2().step([1])
    assert capsys.readouterr().out.splitlines() == ["Step callback triggered with batch [1]"] * 2

    # "Callback Inheritence": the order the docs give
    class TrainerA(Trainer):
        name = "trainer_a"

        def post_epoch_callback(self) -> None:
            print("Trainer A post epoch callback")

    class TrainerB(TrainerA):
        name = "trainer_b"

        callbacks = [("post-epoch", lambda self: print("Trainer B post epoch callback 1"))]

        def post_epoch_callback(self) -> None:
            print("Trainer B post epoch callback 2")

    TrainerB().epoch()
    assert capsys.readouterr().out.splitlines() == [
        "Trainer A post epoch callback", "Trainer B post epoch callback 1", "Trainer B post epoch callback 2"]

    # "Defining a Custom Callback": `trainer.callbacks.append(...)` does nothing for
    # that trainer in ArcticTraining (the class's list was read already); refused here.
    trainer = MyTrainer()
    with pytest.raises(at.HookError, match="read when the class is created"):
        trainer.callbacks.append(("pre-init", lambda self: None))
