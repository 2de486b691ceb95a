"""Scenarios run by tests/integrations/test_arctic_training.py against ArcticTraining's
released callback mixin and against hookwrap's drop-in, in a subprocess each:

    python _arctic_training_scenarios.py at|hookwrap ARCTIC_TRAINING_ROOT

prints one JSON object, scenario name -> what it returned (or the exception it
raised: ["raises", ValueError or TypeError or its type's name], as hookwrap's
errors subclass the built-in ArcticTraining raises). Our own scenarios; no ArcticTraining
code is here (with ``at`` the mixin is imported from the path the caller gives; both
sides take ArcticTraining's ``Callback`` from there, as its Ray launcher does).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import sys
from abc import ABC, abstractmethod
from typing import Any, Callable

SCENARIOS: dict[str, Callable[[Any, Any], Any]] = {}
# What was logged, [level, message]: ArcticTraining's (its arctic_training.logging,
# replaced by a recording one) or the drop-in's (logging, "hookwrap.integrations...").
LOG: list[list[str]] = []
# arctic_training.callback.callback.Callback, which its Ray launcher adds to a trainer.
CALLBACK: Any = None


def scenario(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    SCENARIOS[fn.__name__] = fn
    return fn


# Classes are compiled without this module's `from __future__ import annotations`
# (dont_inherit): `-> None` must be the object None, as ArcticTraining reads
# inspect.signature(...).return_annotation.
def make(source: str, M: Any, w: Any, **names: Any) -> dict[str, Any]:
    space: dict[str, Any] = {"CallbackMixin": M, "callback_wrapper": w, "ABC": ABC,
                             "abstractmethod": abstractmethod, **names}
    exec(compile(source, "<scenario>", "exec", dont_inherit=True), space)
    return space


BASE = '''
class BaseClass(ABC, CallbackMixin):
    val = 16
    @callback_wrapper("no-args")
    def no_args(self) -> int:
        return self.val * 42
    @callback_wrapper("one-arg")
    def one_arg(self, val: int) -> int:
        return val * 10
    @callback_wrapper("multi-args")
    def multi_args(self, val1: int, val2: int) -> int:
        return val1 * val2
    @callback_wrapper("no-out")
    def no_out(self, val: int) -> None:
        self.val = val + 42
    @callback_wrapper("any-out")
    def any_out(self, val: int) -> int:
        return val * 2
    @abstractmethod
    @callback_wrapper("abstract")
    def abstract(self, val: int) -> int:
        pass
class SubClass(BaseClass):
    val = 32
    def abstract(self, val: int) -> int:
        return val ** 2
class SubSubClass(SubClass):
    val = 64
    def abstract(self, val: int) -> int:
        return val ** 3
def no_args_cb(self) -> None:
    self.val = self.val + 123
def one_arg_cb(self, val: int) -> int:
    return val * 7
'''


def _methods_case(M: Any, w: Any, base: str, method: str) -> Any:
    """Each kind of method with a pre and a post callback, on a subclass of a class
    with an abstract wrapped method: what the call returns, or the object's val."""
    space = make(BASE, M, w)
    n = len(inspect.signature(getattr(space[base], method)).parameters) - 1
    pre = {0: space["no_args_cb"], 1: space["one_arg_cb"], 2: None}[n]
    if n == 2:
        # by name, in the callback's own order
        pre = make("def cb(self, val2, val1):\n    return val2 + 1, val1 * 3\n", M, w)["cb"]
    returns_none = inspect.signature(getattr(space[base], method)).return_annotation is None
    post = space["no_args_cb"] if returns_none else space["one_arg_cb"]
    event = method.replace("_", "-")
    cls = type("WithCallbacks", (space[base],), {"callbacks": [(f"pre-{event}", pre), (f"post-{event}", post)]})
    obj = cls()
    out = getattr(obj, method)(*[obj.val] * n)
    return obj.val if out is None else out


for _base in ("SubClass", "SubSubClass"):
    for _method in ("no_args", "one_arg", "multi_args", "no_out", "any_out", "abstract"):
        SCENARIOS[f"methods[{_base}-{_method}]"] = functools.partial(_methods_case, base=_base, method=_method)


@scenario
def keywords_after_a_pre_callback(M: Any, w: Any) -> Any:
    s = make('''
seen = []
class T(CallbackMixin):
    @callback_wrapper("step")
    def step(self, a, b=2, *args, **kwargs) -> int:
        seen.append([a, b, list(args), kwargs])
        return a
    def pre_step_callback(self, b):
        return b * 10
T().step(1, 3, 4, x=5)
''', M, w)
    return s["seen"]


@scenario
def returns_replaced_by_none(M: Any, w: Any) -> Any:
    s = make('''
class T(CallbackMixin):
    @callback_wrapper("loss")
    def loss(self, x) -> float:
        return x
    @callback_wrapper("lr")
    def lr(self, x) -> float:
        return x
    def post_loss_callback(self, v):
        pass
    def pre_lr_callback(self, x):
        pass
''', M, w)
    t = s["T"]()
    return [t.loss(3), t.lr(3)]


@scenario
def post_of_a_none_method(M: Any, w: Any) -> Any:
    s = make('''
class T(CallbackMixin):
    @callback_wrapper("step")
    def step(self) -> None:
        pass
    def post_step_callback(self):
        return 7
''', M, w)
    return s["T"]().step()


@scenario
def unannotated_method(M: Any, w: Any) -> Any:
    s = make('''
class T(CallbackMixin):
    @callback_wrapper("step")
    def step(self):
        return 1
    def post_step_callback(self, r):
        return r + 1
''', M, w)
    return s["T"]().step()


@scenario
def string_none_annotation(M: Any, w: Any) -> Any:
    s = make('''from __future__ import annotations
class T(CallbackMixin):
    @callback_wrapper("step")
    def step(self) -> None:
        pass
    def post_step_callback(self, r):
        return ["got", r]
''', M, w)
    return s["T"]().step()


@scenario
def order_of_lists_and_methods(M: Any, w: Any) -> Any:
    s = make('''
log = []
class T(CallbackMixin):
    callbacks = [("post-step", lambda self, r: log.append(["list post", r]) or r + 1),
                 ("pre-step", lambda self, x: log.append(["list pre", x]) or x + 1)]
    @callback_wrapper("step")
    def step(self, x) -> int:
        log.append(["step", x])
        return x
    def post_step_callback(self, r):
        log.append(["method post", r])
        return r * 10
    def pre_step_callback_2(self, x):
        log.append(["method pre 2", x])
        return x
    def pre_step_callback(self, x):
        log.append(["method pre", x])
        return x
result = T().step(1)
''', M, w)
    return [s["result"], s["log"]]


@scenario
def lists_accumulate_without_duplicates(M: Any, w: Any) -> Any:
    s = make('''
log = []
def cb(self):
    log.append("cb")
class A(CallbackMixin):
    callbacks = [("pre-step", cb)]
    @callback_wrapper("step")
    def step(self) -> None:
        log.append("step")
class B(A):
    callbacks = [*A.callbacks, ("pre-step", lambda self: log.append("B"))]
class C(B):
    pass
C().step()
''', M, w)
    return s["log"]


@scenario
def base_names_a_subclass_event(M: Any, w: Any) -> Any:
    s = make('''
log = []
class A(CallbackMixin):
    callbacks = [("pre-train", lambda self: log.append("A list"))]
class B(A):
    @callback_wrapper("train")
    def train(self) -> None:
        log.append("train")
class C(B):
    pass
C().train()
B().train()
''', M, w)
    return s["log"]


@scenario
def init_callbacks(M: Any, w: Any) -> Any:
    s = make('''
log = []
class T(CallbackMixin):
    def __init__(self, cfg, mode="train") -> None:
        self.cfg = cfg
        self.mode = mode
    def pre_init_callback(self, cfg):
        log.append(["pre", cfg])
        return cfg + "!"
    def post_init_callback(self):
        log.append(["post", self.cfg])
class Bare(CallbackMixin):
    pass
t = T("c")
Bare(1, a=2)
''', M, w)
    return [s["log"], s["t"].mode]


@scenario
def super_call(M: Any, w: Any) -> Any:
    s = make('''
log = []
class A(CallbackMixin):
    @callback_wrapper("step")
    def step(self, x) -> int:
        return x
    def pre_step_callback(self, x):
        log.append(x)
        return x + 1
class B(A):
    def step(self, x) -> int:
        return super().step(x)
result = B().step(1)
''', M, w)
    return [s["result"], s["log"]]


@scenario
def docs_inheritance(M: Any, w: Any) -> Any:
    s = make('''
log = []
class Trainer(CallbackMixin):
    @callback_wrapper("epoch")
    def epoch(self) -> None:
        pass
class TrainerA(Trainer):
    def post_epoch_callback(self):
        log.append("Trainer A post epoch callback")
class TrainerB(TrainerA):
    callbacks = [("post-epoch", lambda self: log.append("Trainer B post epoch callback 1"))]
    def post_epoch_callback(self):
        log.append("Trainer B post epoch callback 2")
TrainerB().epoch()
''', M, w)
    return s["log"]


@scenario
def post_predict(M: Any, w: Any) -> Any:
    s = make('''
class T(CallbackMixin):
    @callback_wrapper("predict")
    def predict(self, x) -> int:
        return x
    def post_predict_callback(self, r):
        return r * 2
''', M, w)
    return s["T"]().predict(3)


def _info(run: Callable[[], Any]) -> list[Any]:
    """What ``run`` returned and the INFO lines it logged (ArcticTraining's Callback
    also logs at DEBUG, on both sides: it is its own)."""
    del LOG[:]
    out = run()
    return [out, [message for level, message in LOG if level == "INFO"]]


@scenario
def default_init_log_callbacks(M: Any, w: Any) -> Any:
    # ArcticTraining's CallbackMixin.callbacks (arctic_training/callback/mixin.py:62-66,
    # its logging.py): three INFO lines per instance, the last listing every callback;
    # a class declaring its own list has none of them, its subclasses its list.
    s = make("""
class Factory(CallbackMixin):
    @callback_wrapper("load")
    def load(self, x) -> int:
        return x
    @callback_wrapper("multi-args")
    def multi_args(self, a, b) -> int:
        return a
    def pre_load_callback(self, x):
        return x + 1
class Sub(Factory):
    callbacks = [("post-load", lambda self, r: r * 2)]
class Trainer(CallbackMixin):
    callbacks = [("post-step", lambda self, r: r)]
    @callback_wrapper("step")
    def step(self, x) -> int:
        return x
class Bare(CallbackMixin):
    def __init__(self, cfg, mode="train") -> None:
        self.cfg = cfg
""", M, w)
    return [_info(lambda: s["Factory"]().load(1)), _info(lambda: s["Sub"]().load(1)),
            _info(lambda: s["Trainer"]().step(1)), _info(lambda: s["Bare"]("c", mode="x").cfg),
            [[event, fn.__name__] for event, fn in M.callbacks]]


@scenario
def unannotated_init_with_the_defaults(M: Any, w: Any) -> Any:
    # ArcticTraining passes the post-init log callback the return value then (an
    # unannotated method's), which it does not take: a TypeError, here too.
    s = make("""
class T(CallbackMixin):
    def __init__(self, cfg):
        self.cfg = cfg
""", M, w)
    return s["T"]("c").cfg


def _event_methods(cls_or_obj: Any) -> list[Any]:
    return [[event, method.__name__, list(inspect.signature(method).parameters),
             repr(inspect.signature(method).return_annotation)]
            for event, method in cls_or_obj._get_all_callback_event_methods().items()]


@scenario
def callback_event_methods(M: Any, w: Any) -> Any:
    s = make(BASE, M, w)
    return [_event_methods(s["SubSubClass"]), _event_methods(s["SubSubClass"]())]


@scenario
def initialized_callbacks(M: Any, w: Any) -> Any:
    s = make("""
def listed(self, x):
    return x
class T(CallbackMixin):
    callbacks = [("pre-step", listed)]
    @callback_wrapper("step")
    def step(self, x) -> int:
        return x
    def post_step_callback(self, r):
        return r
class U(T):
    pass
class V(CallbackMixin):
    @callback_wrapper("step")
    def step(self, x) -> int:
        return x
""", M, w)
    t, u, v = s["T"](), s["U"](), s["V"]()
    return [[isinstance(o._initialized_callbacks, list), [repr(cb) for cb in o._initialized_callbacks],
             [[cb.event, cb.fn.__name__] for cb in o._initialized_callbacks]] for o in (t, u, v)]


_LAUNCHED = """
log = []
class Trainer(CallbackMixin):
    def __init__(self, config, mode="train") -> None:
        self.config, self.mode, self.global_step = config, mode, 0
    @callback_wrapper("step")
    def step(self, batch) -> None:
        self.global_step += 1
    @callback_wrapper("checkpoint")
    def checkpoint(self) -> None:
        log.append(["checkpoint", self.global_step])
    @callback_wrapper("loss")
    def loss(self, batch) -> float:
        return float(sum(batch))
    @callback_wrapper("train")
    def train(self) -> None:
        for batch in ([1], [2], [3]):
            self.loss(batch)
            self.step(batch)
        self.checkpoint()
    def post_step_callback(self):
        log.append(["own post-step", self.global_step])
class MyTrainer(Trainer):
    pass
def _post_step_ray_report(trainer):
    log.append(["ray report", trainer.global_step])
def _post_checkpoint_ray_save(trainer):
    log.append(["ray save", trainer.global_step])
def _post_loss_ray(trainer, loss):
    log.append(["ray loss", loss])
    return loss * 10
"""


def _attach_ray_callbacks(trainer: Any, space: dict[str, Any]) -> None:
    # arctic_training/launcher/ray_launcher.py:89-101 (0.8.0), _attach_ray_callbacks,
    # as it is (its two callbacks are the scenario's, recording instead of ray.train.report).
    Callback = CALLBACK
    event_methods = trainer._get_all_callback_event_methods()
    callbacks_to_add = []

    if "post-step" in event_methods:
        callbacks_to_add.append(Callback("post-step", space["_post_step_ray_report"], event_methods["post-step"]))
    if "post-checkpoint" in event_methods:
        callbacks_to_add.append(
            Callback("post-checkpoint", space["_post_checkpoint_ray_save"], event_methods["post-checkpoint"])
        )

    trainer._initialized_callbacks.extend(callbacks_to_add)


@scenario
def ray_launcher_attaches_its_callbacks(M: Any, w: Any) -> Any:
    # ray_launcher.py:150-160: trainer_cls(config, mode=...), _attach_ray_callbacks(trainer),
    # trainer.train().
    s = make(_LAUNCHED, M, w)
    trainer = s["MyTrainer"]("config", mode="train")
    _attach_ray_callbacks(trainer, s)
    trainer.train()
    # The list is MyTrainer's: an object of its base does not run them.
    s["log"].append("base")
    s["Trainer"]("config").step([1])
    return [s["log"], [repr(cb) for cb in trainer._initialized_callbacks][-2:]]


@scenario
def ray_callbacks_with_arguments_and_values(M: Any, w: Any) -> Any:
    # Callbacks made as the launcher makes them, on a method taking an argument and
    # returning a value: pre (the argument replaced) and post (the value replaced).
    s = make(_LAUNCHED + """
def _pre_loss_ray(self, batch):  # a pre callback's first parameter is `self` (checked)
    log.append(["ray pre-loss", batch])
    return [x * 2 for x in batch]
""", M, w)
    trainer = s["MyTrainer"]("config")
    methods = trainer._get_all_callback_event_methods()
    trainer._initialized_callbacks.extend([CALLBACK("pre-loss", s["_pre_loss_ray"], methods["pre-loss"]),
                                           CALLBACK("post-loss", s["_post_loss_ray"], methods["post-loss"])])
    return [trainer.loss([1, 2]), s["log"]]


@scenario
def ray_callbacks_last_until_the_class_is_instantiated_again(M: Any, w: Any) -> Any:
    # ArcticTraining's __new__ makes the class's list anew (mixin.py:74-82): what the
    # launcher added stops running, for the first object too.
    s = make(_LAUNCHED, M, w)
    first = s["MyTrainer"]("config")
    _attach_ray_callbacks(first, s)
    first.step([1])
    second = s["MyTrainer"]("config")
    first.step([1])
    second.step([1])
    return [s["log"], len(first._initialized_callbacks)]


def _refused(source: str, call: str = "T()") -> Callable[[Any, Any], Any]:
    def run(M: Any, w: Any) -> Any:
        s = make(source, M, w)
        return eval(call, s)
    return run


_STEP = '''
class T(CallbackMixin):
    callbacks = CALLBACKS
    @callback_wrapper("step")
    def step(self, a) -> int:
        return a
'''

for _name, _callbacks in {
    "unknown_event": '[("pre-stpe", lambda self: None)]',
    "parameter_not_of_the_method": '[("pre-step", lambda self, z: z)]',
    "parameter_with_a_default": '[("pre-step", lambda self, a=1: a)]',
    "var_positional_parameter": '[("pre-step", lambda self, *a: a)]',
    "post_parameter_count": '[("post-step", lambda self: 1)]',
}.items():
    SCENARIOS[f"refused[{_name}]"] = _refused(_STEP.replace("CALLBACKS", _callbacks))

SCENARIOS["refused[pre_returns_wrong_count]"] = _refused(
    _STEP.replace("step(self, a)", "step(self, a, b)").replace(
        "CALLBACKS", '[("pre-step", lambda self, a, b: (a, b, a))]'), "T().step(1, 2)")
SCENARIOS["refused[pre_returns_no_sequence]"] = _refused(
    _STEP.replace("step(self, a)", "step(self, a, b)").replace(
        "CALLBACKS", '[("pre-step", lambda self, a, b: a)]'), "T().step(1, 2)")
SCENARIOS["refused[pre_without_arguments_returns]"] = _refused(
    _STEP.replace("CALLBACKS", '[("pre-step", lambda self: 1)]'), "T().step(1)")


class _Recording(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        LOG.append([record.levelname, record.getMessage()])


def main() -> None:
    global CALLBACK, LOG
    sys.path.insert(0, sys.argv[2])
    import arctic_training.logging
    from arctic_training.callback.callback import Callback
    CALLBACK = Callback
    if sys.argv[1] == "at":
        from arctic_training.callback.mixin import CallbackMixin, callback_wrapper
        LOG = arctic_training.logging.records
    else:
        from hookwrap.integrations.arctic_training import CallbackMixin, callback_wrapper
        drop_in = logging.getLogger("hookwrap.integrations.arctic_training")
        drop_in.setLevel(logging.DEBUG)
        drop_in.addHandler(_Recording())
    out: dict[str, Any] = {}
    for name, run in SCENARIOS.items():
        try:
            out[name] = run(CallbackMixin, callback_wrapper)
        except Exception as e:  # what it raised is the result
            kind = next((k for k in (ValueError, TypeError) if isinstance(e, k)), type(e))
            out[name] = ["raises", kind.__name__]
    import hookwrap
    print(json.dumps({"using_extension": hookwrap.USING_EXTENSION, "results": out}))


if __name__ == "__main__":
    main()
