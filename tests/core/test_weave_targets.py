"""What ``weave`` accepts and what it survives: event names chosen at weave time,
dotted targets on lazy packages, targets that never resolve, libraries that
re-patch the methods they own, and what it refuses."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest


def test_weave_names_the_events(hw):
    class Trainer:
        def training_step(self, batch: int) -> int:
            return batch

        def compute_loss(self, batch: int) -> int:
            return batch * 2

    with hw.weave(Trainer, step="training_step", loss="compute_loss") as handle:
        hw.before(Trainer, "step", lambda self, batch: batch + 1)
        hw.after(Trainer, "loss", lambda self, return_value: return_value * 10)
        assert (Trainer().training_step(1), Trainer().compute_loss(1)) == (2, 20)
        assert set(hw.describe(Trainer).chains) == {"step", "loss"}
        with pytest.raises(hw.UnknownEventError, match="no join point 'training_step'"):
            hw.before(Trainer, "training_step", lambda self: None)
        assert handle.applied
    assert (Trainer().training_step(1), Trainer().compute_loss(1)) == (1, 2)


def test_weave_names_a_module_function_event(hw, tmp_path, monkeypatch):
    (tmp_path / "woven_script_mod.py").write_text("def train_one_batch(loss):\n    return loss\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import woven_script_mod as mod

    seen = []
    with hw.weave(mod, step="train_one_batch"):
        hw.after(mod, "step", lambda return_value: seen.append(return_value) or return_value)
        assert mod.train_one_batch(3) == 3
    assert seen == [3] and mod.train_one_batch(4) == 4 and seen == [3]


@pytest.mark.parametrize("args, kwargs, message", [
    ((), {}, "name the methods or functions"),
    (("training_step",), {"step": "training_step"}, "'training_step' is named twice"),
    ((), {"step": "training_step", "loss": "training_step"}, "named twice"),
    (("missing",), {}, "no attribute 'missing' to weave"),
    (("label",), {}, "'label' is a str, not a method"),
    (("3x",), {}, "'3x' is not an attribute name"),
])
def test_weave_refuses_bad_names_before_changing_anything(hw, args, kwargs, message):
    class Trainer:
        label = "t"

        def training_step(self) -> None:
            pass

    original = vars(Trainer)["training_step"]
    with pytest.raises(hw.HookError, match=message):
        hw.weave(Trainer, *args, **kwargs)
    assert vars(Trainer)["training_step"] is original


def test_weave_refuses_an_event_name_the_class_already_has(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            pass

        def training_step(self) -> None:
            pass

    with pytest.raises(hw.HookError, match="already has a join point 'step'"):
        hw.weave(Trainer, step="training_step")


@pytest.mark.parametrize("target", [int, dict, type(sys)])
def test_weave_refuses_builtin_types(hw, target):
    name = next(n for n in ("bit_length", "keys", "__repr__") if hasattr(target, n))
    with pytest.raises(hw.HookError, match="built-in or extension type"):
        hw.weave(target, name)


@pytest.mark.parametrize("target", ["a b:C", "pkg:C:D", ":Trainer", "pkg:C..x", "pkg.:C"])
def test_weave_refuses_bad_dotted_targets(hw, target):
    with pytest.raises(hw.HookError, match="a dotted target is 'package.module:Class'"):
        hw.weave(target, "x")


def test_weave_of_an_imported_module_names_a_missing_attribute(hw):
    with pytest.raises(hw.HookError, match="json has no attribute 'dumps5'.*Did you mean 'dumps'"):
        hw.weave("json:dumps5", "x")


@pytest.mark.parametrize("target, hint", [
    ("json.dumps", r"json is imported and has no submodule 'dumps'\. dumps is a function of json: "
                   r"weave it with hookwrap\.weave\('json', 'dumps'\)\."),
    ("json.decoder.JSONDecoder", r"json\.decoder is imported and is a module, not a package: it has no "
                                 r"submodule 'JSONDecoder'\. .*hookwrap\.weave\('json\.decoder:JSONDecoder', \.\.\.\)"),
    ("json.nothing_here", r"json is imported and has no submodule 'nothing_here'\. Check the spelling"),
    ("os.path.nothing", r"os\.path is imported and is a module, not a package: it has no submodule 'nothing'"),
])
def test_weave_of_a_submodule_that_cannot_exist_is_refused_at_once(hw, target, hint):
    # hw.weave("json.dumps", "x") waited for an import of json.dumps, which cannot
    # happen: json is imported and has no such submodule.
    with pytest.raises(hw.HookError, match=rf"weave\('{re.escape(target)}'\): {hint}"):
        hw.weave(target, "x")
    assert target not in sys.modules


_LAZY_PACKAGE = {
    # transformers' pattern: the package replaces itself in sys.modules with a lazy
    # module whose __getattr__ imports the submodule that defines the class.
    "lazypkg/__init__.py": """
        import importlib, sys, types

        class _Lazy(types.ModuleType):
            def __getattr__(self, name):
                if name == "Trainer":
                    value = importlib.import_module(".trainer", __name__).Trainer
                    setattr(self, name, value)
                    return value
                raise AttributeError(name)

        lazy = _Lazy(__name__)
        lazy.__path__, lazy.__spec__ = __path__, __spec__
        sys.modules[__name__] = lazy
    """,
    "lazypkg/trainer.py": """
        import lazypkg

        class Trainer:
            def compute_loss(self, x):
                return x
    """,
}


def _run(hw: Any, tmp_path: Any, script: str) -> subprocess.CompletedProcess[str]:
    for path, text in _LAZY_PACKAGE.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1",
               PYTHONPATH=str(tmp_path))
    return subprocess.run([sys.executable, "-W", "error::hookwrap.HookwrapWarning", "-c",
                           textwrap.dedent(script)], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=120)


def test_a_dotted_target_resolves_through_a_lazy_package(hw, tmp_path):
    out = _run(hw, tmp_path, """
        import hookwrap as hw
        handle = hw.weave("lazypkg:Trainer", loss="compute_loss")
        print(handle)
        from lazypkg import Trainer
        print(handle)
        hw.after(Trainer, "loss", lambda self, return_value: return_value * 10)
        print(Trainer().compute_loss(2))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["<hookwrap.WeaveHandle lazypkg:Trainer pending import>",
                                       "<hookwrap.WeaveHandle lazypkg:Trainer applied>", "20"]


def test_a_dotted_target_that_never_resolves_warns_on_import(hw, tmp_path):
    out = _run(hw, tmp_path, """
        import warnings
        import hookwrap as hw
        handle = hw.weave("lazypkg:Trainr", "compute_loss")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import lazypkg
        print(caught[0].message)
        print(handle)
    """)
    assert out.returncode == 0, out.stderr
    warning, state = out.stdout.splitlines()
    assert "hookwrap.weave('lazypkg:Trainr'): lazypkg was imported, but the target could not be woven" in warning
    assert "lazypkg has no attribute 'Trainr'" in warning and "Check the spelling" in warning
    assert state == "<hookwrap.WeaveHandle lazypkg:Trainr failed: lazypkg has no attribute 'Trainr'>"


def _repatch(cls: type, name: str) -> None:
    """What torch.optim does to every optimizer class's step on its first instance."""
    inner = getattr(cls, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs)

    setattr(cls, name, wrapper)


def test_a_weave_survives_its_class_re_patching_the_method(hw):
    class Optimizer:
        def step(self, lr: float) -> float:
            return lr

    calls = []
    with hw.weave(Optimizer, "step"):
        hw.before(Optimizer, "step", lambda self, lr: calls.append(lr) or lr * 2)
        _repatch(Optimizer, "step")
        _repatch(Optimizer, "step")  # twice: still one join point, fired once
        assert Optimizer().step(1.0) == 2.0
        assert calls == [1.0]
        obj = Optimizer()
        hw.after(obj, "step", lambda self, return_value: calls.append("own") or return_value)
        assert obj.step(3.0) == 6.0 and calls == [1.0, 3.0, "own"]
    assert Optimizer().step(1.0) == 1.0


def test_weave_and_remove_while_other_threads_call_never_fail_a_call(hw):
    import threading

    class Trainer:
        def training_step(self, batch: int) -> int:
            return batch

    errors: list[str] = []
    results: set[int] = set()
    done = threading.Event()

    def call() -> None:
        trainer = Trainer()
        while not done.is_set():
            try:
                results.add(trainer.training_step(1))
            except Exception as exc:  # any failure of a call is the bug
                errors.append(repr(exc))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(800):  # a race: without the fix, about one run in three fails at 200
            with hw.weave(Trainer, step="training_step"):
                hw.before(Trainer, "step", lambda self, batch: 2)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert results <= {1, 2} and 1 in results


def _wraps(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def test_a_decorator_over_a_hookable_method_leaves_the_class_working(hw):
    class Model:  # as @torch.no_grad() over @hw.hookable does
        @_wraps
        @hw.hookable
        def evaluate(self) -> int:
            return 1

    assert Model().evaluate() == 1
    hw.describe(Model)  # scanning the class neither fails nor renames anything


def test_a_wrapper_of_a_hookable_function_stored_in_a_class_does_not_take_it_over(hw):
    @hw.hookable
    def loss(x: int) -> int:
        return x * 2

    fired = []
    hw.after(loss, "loss", lambda return_value: fired.append(return_value) or return_value)

    class Holder:
        helper = staticmethod(_wraps(loss))
        also = _wraps(loss)

    hw.describe(Holder)
    assert loss(3) == 6 and Holder.helper(4) == 8 and fired == [6, 8]
    hw.after(loss, "loss", lambda return_value: return_value)  # still loss's own join point


def test_hookable_over_a_wrapper_of_a_join_point_makes_a_join_point_of_its_own(hw):
    log: list[Any] = []

    class Base:
        @hw.hookable
        def step(self) -> int:
            return 1

    @hw.hookable("forward_timed")
    @_wraps
    def forward(x: int) -> int:
        return x

    assert hw.describe(forward).title == "join point 'forward_timed'"

    class Sub(Base):
        @hw.hookable
        @functools.wraps(Base.step)
        def step(self) -> int:
            log.append("sub")
            return super().step() + 10

    hw.after(Sub, "step", lambda self, return_value: log.append(("post", return_value)) or return_value)
    assert Sub().step() == 11 and log == ["sub", ("post", 11)]
    with pytest.raises(hw.HookError, match="'step' is already a join point"):
        hw.weave(Sub, "step")


def test_unfit_global_callbacks_keep_no_join_point_alive(hw):
    import gc

    class Other:
        def step(self, a: int, b: int) -> int:
            return a

    class Fits(hw.Hookable):
        @hw.hookable
        def step(self, x: int) -> int:
            return x

    with hw.register_global_callback(("pre-step", lambda self, x: x)) as handle:
        registration = handle._places[0][1]
        others = len(registration.steps)  # the 'step' join points of other tests' classes, alive
        for _ in range(50):
            with hw.weave(Other, "step"):
                Other().step(1, 2)  # the callback does not fit: skipped, noted once
        gc.collect()
        assert len(registration.steps) <= others + 2  # not one entry per weave


def test_a_lazy_module_raising_anything_does_not_fail_the_import(hw, tmp_path):
    (tmp_path / "failing_lazy.py").write_text(textwrap.dedent("""
        def __getattr__(name):
            raise RuntimeError("Failed to import failing_lazy.trainer: a missing backend")
    """))
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1",
               PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import warnings
        import hookwrap as hw
        handle = hw.weave("failing_lazy:Trainer", step="training_step")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import failing_lazy
        print(handle)
    """)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "failed: RuntimeError: Failed to import failing_lazy.trainer" in out.stdout


@pytest.mark.parametrize("events, message", [
    ({"pre_step": "training_step"}, "cannot start with 'pre'"),
    ({"post": "training_step"}, "cannot start with 'post'"),
])
def test_weave_refuses_an_event_name_that_reads_as_a_phase(hw, events, message):
    class Trainer:
        def training_step(self) -> None:
            pass

    with pytest.raises(hw.HookError, match=message):
        hw.weave(Trainer, **events)


def test_weave_takes_target_as_an_event_name(hw):
    class Trainer:
        def fit(self) -> int:
            return 1

    with hw.weave(Trainer, target="fit"):
        hw.after(Trainer, "target", lambda self, return_value: return_value + 1)
        assert Trainer().fit() == 2


@pytest.mark.parametrize("events", [{}, {"update": "step"}], ids=["own-name", "event-name"])
def test_weaving_a_base_weaves_the_overrides_its_subclasses_have(hw, events):
    # weave(torch.optim.Optimizer, "step") wove only the base's step, which every
    # optimizer class overrides: none of their steps fired, and nothing said so.
    # Overrides that exist when weaving are woven too, under the same event, as an
    # override of a @hookable method stays hookable (contract §1).
    class Base:
        def step(self, lr: float) -> str:
            return "base"

    class Own(Base):
        def step(self, lr: float) -> str:
            return "own"

    class CallsSuper(Base):
        def step(self, lr: float) -> str:
            return super().step(lr) + "+super"

    class Inherits(Own):
        pass

    class Plain(Base):
        pass

    event = "update" if events else "step"
    before = {cls: dict(vars(cls)) for cls in (Base, Own, CallsSuper, Inherits, Plain)}
    seen: list[str] = []
    with (hw.weave(Base, **events) if events else hw.weave(Base, "step")):
        assert "step" not in vars(Inherits) and "step" not in vars(Plain)
        hw.before(Base, event, lambda self, lr: seen.append(type(self).__name__) or lr)
        results = [cls().step(0.1) for cls in (Base, Own, CallsSuper, Inherits, Plain)]
        assert results == ["base", "own", "base+super", "own", "base"]
        assert seen == ["Base", "Own", "CallsSuper", "Inherits", "Plain"]  # once each
        own = Own()
        hw.after(own, event, lambda self, return_value: return_value + "!")
        assert own.step(0.1) == "own!"
    assert {cls: dict(vars(cls)) for cls in before} == before
    seen.clear()
    assert Own().step(0.1) == "own" and seen == []


def _profiled(func):
    """DeepSpeed's ``instrument_w_nvtx`` (deepspeed/utils/nvtx.py), as it is: a wrapper
    taking ``(*args, **kwargs)``, no ``functools.wraps``."""

    def wrapped_fn(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapped_fn


def _counted(calls):
    """A decorator that hides the method behind ``(*args, **kwargs)`` and whose closure
    holds no function: nothing tells the method's parameters."""

    def decorate(func):
        held = {"method": func}

        def wrapped(*args, **kwargs):
            calls.append(args[1:])
            return held["method"](*args, **kwargs)

        return wrapped

    return decorate


def test_a_method_behind_a_decorator_without_wraps_is_woven_by_its_own_signature(hw, ext):
    """DeepSpeedEngine.backward is decorated so: woven, every call runs as unwoven (it
    raised CallbackSignatureError at each call before), and callbacks name the method's
    own arguments, read through the function the wrapper's closure holds."""

    class Engine:
        @_profiled
        def backward(self, loss, retain_graph=False):
            return (loss * 2, retain_graph)

    with hw.weave(Engine, "backward"):
        engine = Engine()
        assert engine.backward(3) == (6, False)
        assert ext.join_points(Engine, "backward")[0].arguments == ("loss", "retain_graph")
        seen = []
        hw.before(engine, "backward", lambda self, loss, retain_graph: (seen.append((loss, retain_graph)), (loss, retain_graph))[1])
        hw.before(engine, "backward", lambda self, loss: loss + 1)
        assert engine.backward(3, retain_graph=True) == (8, True)
        assert seen == [(3, True)]


def test_a_method_whose_signature_nothing_tells_passes_its_arguments_through(hw, ext):
    """No __wrapped__, no one function in the closure: the join point's arguments are
    the wrapper's (``args``, ``kwargs``), every call runs as unwoven, and a callback
    naming an argument of the hidden method is refused when it is registered."""
    calls = []

    class Engine:
        @_counted(calls)
        def step(self, lr, scale=1.0):
            return lr * scale

    with hw.weave(Engine, "step"):
        engine = Engine()
        assert engine.step(2, scale=3) == 6
        assert ext.join_points(Engine, "step")[0].arguments == ("args", "kwargs")
        seen = []
        hw.after(engine, "step", lambda self, args, kwargs, return_value: (seen.append((args, kwargs, return_value)), return_value)[1])
        assert engine.step(2, scale=3) == 6
        assert seen == [((2,), {"scale": 3}, 6)]
        with pytest.raises(hw.CallbackSignatureError, match=r"'lr'.*args, kwargs"):
            hw.before(engine, "step", lambda self, lr: lr)
    assert calls == [(2,), (2,)]


def test_a_method_no_call_could_bind_is_refused_when_woven(hw):
    """A method with no positional parameter for the object is refused by weave, which
    leaves the class as it was; before, the weave succeeded and every call raised."""

    class Odd:
        def method(*, x):
            return x

    original = vars(Odd)["method"]
    with pytest.raises(hw.CallbackSignatureError, match=r"Odd\.method.*no positional `self`"):
        hw.weave(Odd, "method")
    assert vars(Odd)["method"] is original
