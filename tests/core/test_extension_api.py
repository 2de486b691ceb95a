"""hookwrap.extend, the extension API: the shipped callbacks use only it and the
public API, and a callback written here, outside the package, on it alone behaves
like a shipped one (both implementations; no torch needed)."""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib
import io
import os
import re
from typing import Any

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src", "hookwrap")
SHIPPED = ("torch", "integrations")  # the subpackages that must be written on the public API
# What hookwrap.<name> modules the shipped code may import, besides its own package.
PUBLIC_MODULES = {"errors", "extend"}


def private_imports(source: str, package: str, filename: str) -> list[str]:
    """``file:line: import`` for each import in ``source`` (a module of
    ``hookwrap.<package>``) that reaches a private part of hookwrap: an underscored
    module of the core, a core module other than the public ones, or an underscored
    name of the top level."""
    found = []
    own = f"hookwrap.{package}"
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            modules = [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative to a module of hookwrap.<package>
                base = own.split(".")[:len(own.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            modules = [(module, tuple(alias.name for alias in node.names))]
        else:
            continue
        for module, names in modules:
            parts = module.split(".")
            if parts[0] != "hookwrap":
                continue
            if module == own or module.startswith(own + "."):
                continue  # its own package's modules, private ones included
            if len(parts) == 1:
                bad = [n for n in names if n.startswith("_")]
                if not bad:
                    continue  # the public top level: `from .. import Callback`
            elif parts[1] in PUBLIC_MODULES and len(parts) == 2:
                continue
            found.append((node.lineno, f"{filename}:{node.lineno}: {ast.unparse(node)}"))
    return [line for _, line in sorted(found)]


def test_the_check_catches_private_imports_relative_and_absolute():
    source = ("from .. import Callback, weave\n"
              "from ..errors import HookError\n"
              "from ..extend import reader\n"
              "from ._attach import reader\n"
              "from .._joinpoints import reader\n"
              "def f():\n"
              "    import hookwrap._callback\n"
              "from hookwrap._joinpoints import join_point_of\n"
              "from .. import _fast\n"
              "from hookwrap.integrations import _weaving\n")
    assert private_imports(source, "torch", "x.py") == [
        "x.py:5: from .._joinpoints import reader",
        "x.py:7: import hookwrap._callback",
        "x.py:8: from hookwrap._joinpoints import join_point_of",
        "x.py:9: from .. import _fast",
        "x.py:10: from hookwrap.integrations import _weaving",
    ]


def test_shipped_callbacks_and_presets_import_only_the_public_and_extension_api():
    checked, found = [], []
    for package in SHIPPED:
        folder = os.path.join(SRC, package)
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                found += private_imports(f.read(), package, os.path.relpath(path, os.path.dirname(SRC)))
            checked.append(name)
    assert len(checked) >= 15  # every module of both subpackages was read
    assert not found, ("hookwrap.torch and hookwrap.integrations import only hookwrap, hookwrap.errors, "
                       "hookwrap.extend and their own package; expose what they need in hookwrap.extend:\n"
                       + "\n".join(found))


def test_every_name_of_the_extension_api_exists_and_is_documented(ext):
    assert ext.__doc__ and len(ext.__doc__) > 500
    assert sorted(ext.__all__) == sorted(set(ext.__all__))
    for name in ext.__all__:
        value = getattr(ext, name)  # AttributeError names the missing one
        assert (value.__doc__ or "").strip(), f"hookwrap.extend.{name} has no docstring"
    undocumented = [n for n in vars(ext) if not n.startswith("_") and callable(getattr(ext, n))
                    and getattr(getattr(ext, n), "__module__", "") == "hookwrap.extend" and n not in ext.__all__]
    assert not undocumented, f"public-looking names missing from __all__: {undocumented}"


def test_the_worked_examples_of_the_module_docstring_run_and_print_what_they_say(ext):
    examples = re.findall(r"```python\n(.*?)```", ext.__doc__, re.S)
    assert len(examples) == 3
    for index, code in enumerate(examples):
        expected = [line.split("# ", 1)[1] for line in code.splitlines() if line.lstrip().startswith("print(")]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"hookwrap.extend example {index}", "exec"), {"__name__": f"example_{index}"})
        printed = out.getvalue().splitlines()
        assert printed and len(printed) == len(expected)
        for got, want in zip(printed, expected):
            assert got.startswith(want.removesuffix(" ...")) if want.endswith("...") else got == want


def test_importing_the_extension_api_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, hookwrap.extend; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


# --- a callback written outside the package, on the extension API alone -------------------


def make_value_logger(hw: Any, ext: Any) -> type:
    """A user's callback like hookwrap.torch's: the event and the value read are
    settings, checked against the target when attached, saved on resume."""

    class ValueLogger(hw.Callback):
        def __init__(self, event: str = "loss", value: str = "return_value", optional: str = "epoch") -> None:
            self.event, self.value, self.optional = event, value, optional
            self.seen: list[tuple[Any, Any]] = []
            self.epochs = 0

        @property
        def state_key(self) -> str:  # two loggers of other events keep apart in callback_state
            return f"ValueLogger[{self.event}]"

        def event_methods(self, target: Any) -> list[tuple[str, Any]]:
            jps = ext.join_points(target, self.event, where="ValueLogger")
            phase = "pre-" if self.value in jps[0].arguments else "post-"
            pairs = [(f"{phase}{self.event}", ext.reader(self.record, phase, self.value))]
            if ext.has_join_point(target, self.optional):  # attached only where it exists
                pairs.append((f"post-{self.optional}", ext.reader(self.count_epoch, "post-")))
            return pairs

        def record(self, obj: Any, value: Any) -> str:
            self.seen.append((obj, value))
            return "ignored"  # a reader returns what the contract asks, never this

        def count_epoch(self, obj: Any) -> None:
            self.epochs += 1

        def state_dict(self) -> dict[str, Any]:
            return {"seen": [v for _, v in self.seen], "epochs": self.epochs}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.seen = [(None, v) for v in state["seen"]]
            self.epochs = state["epochs"]

    return ValueLogger


def make_loop(hw: Any) -> Any:
    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, x: float, scale: float = 2.0) -> float:
            return x * scale

        @hw.hookable
        def epoch(self, xs: list[float]) -> list[float]:
            return [self.loss(x) for x in xs]

    return Loop


def test_a_user_callback_reads_a_methods_return_value_and_counts_an_optional_event(hw, ext):
    ValueLogger, Loop = make_value_logger(hw, ext), make_loop(hw)
    loop, logger = Loop(), ValueLogger()
    handle = loop.add_callback(logger)
    assert loop.epoch([1.0, 2.5]) == [2.0, 5.0]  # the reader's "ignored" is not a return value
    assert logger.seen == [(loop, 2.0), (loop, 5.0)]
    assert logger.epochs == 1
    assert hw.callback_state(loop) == {"ValueLogger[loss]": {"seen": [2.0, 5.0], "epochs": 1}}
    assert ext.stateful_callbacks(loop) == {"ValueLogger[loss]": logger}
    handle.remove()
    loop.epoch([1.0])
    assert logger.epochs == 1 and len(logger.seen) == 2


def test_a_user_callback_reads_a_pre_argument_and_passes_it_on(hw, ext):
    ValueLogger, Loop = make_value_logger(hw, ext), make_loop(hw)
    loop, logger = Loop(), ValueLogger(value="scale")
    loop.add_callback(logger)
    assert loop.loss(3.0, scale=0.5) == 1.5  # the pre- reader handed the argument back unchanged
    assert logger.seen == [(loop, 0.5)]


def test_a_user_callback_on_a_hookable_function_gets_no_object_and_skips_the_missing_event(hw, ext):
    ValueLogger = make_value_logger(hw, ext)

    @hw.hookable
    def loss(x: float) -> float:
        return x + 1.0

    logger = ValueLogger()
    hw.add_callback(loss, logger)
    assert loss(1.0) == 2.0 and loss(4.0) == 5.0
    assert logger.seen == [(None, 2.0), (None, 5.0)]
    assert logger.epochs == 0
    assert ext.join_points(loss, "loss")[0].has_object is False
    assert ext.join_points(loss, "loss")[0].arguments == ("x",)


def test_a_user_callback_on_the_global_tier_reaches_every_join_point_of_its_name(hw, ext):
    ValueLogger, Loop = make_value_logger(hw, ext), make_loop(hw)
    logger = ValueLogger()
    with logger:
        Loop().loss(1.0)
        Loop().loss(2.0, scale=3.0)
    Loop().loss(5.0)
    assert [v for _, v in logger.seen] == [2.0, 6.0]


def test_a_user_callback_refuses_a_misspelled_event_when_attached(hw, ext):
    ValueLogger, Loop = make_value_logger(hw, ext), make_loop(hw)
    with pytest.raises(hw.UnknownEventError, match=r"ValueLogger: .*Loop has no join point 'los'\. Did you mean 'loss'"):
        Loop().add_callback(ValueLogger(event="los"))
    with pytest.raises(hw.UnknownEventError, match=r"Pass the join point's name, 'loss', not the event 'post-loss'"):
        Loop().add_callback(ValueLogger(event="post-loss"))
    with pytest.raises(hw.CallbackSignatureError, match="nope"):  # a value the join point lacks
        Loop().add_callback(ValueLogger(value="nope"))


def test_a_user_callback_reads_the_exception_of_a_failing_call_which_still_propagates(hw, ext):
    class Failures(hw.Callback):
        def __init__(self) -> None:
            self.failed: list[tuple[Any, str]] = []

        def event_methods(self, target: Any) -> list[tuple[str, Any]]:
            ext.join_points(target, "fit", where="Failures")
            return [("error-fit", ext.reader(self.record, "error-", "exception", ("fit",)))]

        def record(self, obj: Any, event: str, exception: BaseException) -> None:
            self.failed.append((obj, f"{event}: {exception}"))

    class Loop(hw.Hookable):
        @hw.hookable
        def fit(self, epochs: int) -> int:
            if epochs < 0:
                raise ValueError("negative epochs")
            return epochs

    loop, failures = Loop(), Failures()
    loop.add_callback(failures)
    assert loop.fit(2) == 2
    with pytest.raises(ValueError, match="negative epochs"):
        loop.fit(-1)
    assert failures.failed == [(loop, "fit: negative epochs")]


def test_per_join_point_reads_an_argument_on_one_join_point_and_an_attribute_on_another(hw, ext):
    class ModelWatcher(hw.Callback):
        """Reads the model where each join point has it: its argument ``model``, else
        the hooked object's attribute ``model``; a function without it is refused."""

        state_key = "ModelWatcher"

        def __init__(self) -> None:
            self.models: list[tuple[str, Any]] = []

        def event_methods(self, target: Any) -> list[tuple[str, Any]]:
            return [(f"post-{name}", ext.per_join_point(self, "see", self.choose)) for name in ("step", "save")
                    if ext.has_join_point(target, name)]

        def choose(self, jp: Any) -> Any:
            assert isinstance(jp, ext.JoinPointInfo)
            if "model" in jp.arguments:
                return ext.reader(self.see, "post-", "model", (jp.event,))
            if not jp.has_object:
                raise hw.CallbackSignatureError(f"ModelWatcher: {jp.where} has no argument 'model' and no object.")
            return ext.reader(self.see_attribute, "post-", None, (jp.event,))

        def see(self, obj: Any, event: str, model: Any) -> None:
            self.models.append((event, model))

        def see_attribute(self, obj: Any, event: str) -> None:
            self.models.append((event, obj.model))

        def state_dict(self) -> dict[str, Any]:
            return {"models": list(self.models)}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.models = list(state["models"])

    class Trainer(hw.Hookable):
        def __init__(self) -> None:
            self.model = "own model"

        @hw.hookable
        def step(self) -> None:
            pass

        @hw.hookable
        def save(self, model: str) -> None:
            pass

    trainer, watcher = Trainer(), ModelWatcher()
    trainer.add_callback(watcher)
    trainer.step()
    trainer.save("given model")
    assert watcher.models == [("step", "own model"), ("save", "given model")]

    # A copy of the hooked object has its own copy of the callback, choosing anew.
    fresh = Trainer()
    fresh.add_callback(ModelWatcher())
    clone = copy.deepcopy(fresh)
    clone.model = "clone's model"
    clone.step()
    clone.save("given to the clone")
    copied = ext.stateful_callbacks(clone)["ModelWatcher"]
    assert copied.models == [("step", "clone's model"), ("save", "given to the clone")]
    assert ext.stateful_callbacks(fresh)["ModelWatcher"].models == []

    @hw.hookable
    def step() -> None:
        pass

    with pytest.raises(hw.CallbackSignatureError, match=r"ModelWatcher: join point 'step' .* has no argument 'model'"):
        hw.add_callback(step, ModelWatcher())


def test_is_join_point_tells_hookable_attributes_from_plain_ones(hw, ext):
    Loop = make_loop(hw)

    def plain(self: Any) -> None:
        pass

    class Woven:
        def step(self) -> int:
            return 1

    assert ext.is_join_point(vars(Loop)["loss"])
    assert not ext.is_join_point(plain) and not ext.is_join_point(42)
    assert not ext.is_join_point(vars(Woven)["step"])
    handle = hw.weave(Woven, "step")
    assert isinstance(handle, ext.Removable)
    with handle:
        assert ext.is_join_point(vars(Woven)["step"])
    assert not ext.is_join_point(vars(Woven)["step"])  # the context manager removed the weave


def test_a_removable_subclass_is_a_context_manager_that_removes(ext):
    class Undo(ext.Removable):
        def __init__(self) -> None:
            self.removed = 0

        def remove(self) -> None:
            self.removed += 1

    with Undo() as undo:
        assert undo.removed == 0
    assert undo.removed == 1


def test_process_rank_reads_torchruns_rank_before_a_process_group(hw, ext, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert ext.process_rank() == 0
    monkeypatch.setenv("RANK", "3")
    assert ext.process_rank() == 3
    monkeypatch.setenv("RANK", "three")
    with pytest.raises(hw.HookError, match=r"RANK='three' .* not a process rank"):
        ext.process_rank()


def test_join_point_info_describes_the_join_point(hw, ext):
    Loop = make_loop(hw)
    (info,) = ext.join_points(Loop(), "loss")
    assert (info.event, info.arguments, info.has_object, info.returns_none) == ("loss", ("x", "scale"), True, False)
    assert "Loop.loss" in info.where and info.function.__name__ == "loss"
    with pytest.raises(AttributeError):
        info.event = "other"  # type: ignore[misc]


# --- bad input gets a clear error naming the fix ------------------------------------------


def test_bad_input_to_the_extension_api_is_refused_clearly(hw, ext):
    Loop = make_loop(hw)

    class Cb(hw.Callback):
        def see(self, obj: Any, value: Any = None) -> None:
            pass

    cb = Cb()
    with pytest.raises(hw.HookError, match=r"handler must be a method of your callback object \(self.record\)"):
        ext.reader(print, "post-")
    with pytest.raises(hw.HookError, match=r"handler must be a method"):
        ext.reader(lambda obj: None, "post-")
    with pytest.raises(hw.HookError, match=r"event must be 'pre-', 'post-' or 'error-'.*hookwrap.around"):
        ext.reader(cb.see, "around-loss")
    with pytest.raises(hw.HookError, match=r"name must be an argument name"):
        ext.reader(cb.see, "post-", "not a name")
    with pytest.raises(hw.HookError, match=r"extra must be a tuple .* Write extra=\(value,\)"):
        ext.reader(cb.see, "post-", "x", ["e"])  # type: ignore[arg-type]
    with pytest.raises(hw.HookError, match=r"owner must be your callback object"):
        ext.per_join_point(None, "see", lambda jp: None)
    with pytest.raises(hw.HookError, match=r"name must be a non-empty string"):
        ext.per_join_point(cb, "", lambda jp: None)
    with pytest.raises(hw.HookError, match=r"choose must be a callable taking a JoinPointInfo"):
        ext.per_join_point(cb, "see", "see")
    with pytest.raises(hw.HookError, match=r"a join point name must be a non-empty string like 'loss', got 3"):
        ext.join_points(Loop, 3)
    with pytest.raises(hw.HookError, match=r"has_join_point: a join point name must be"):
        ext.has_join_point(Loop, None)
    with pytest.raises(hw.UnknownEventError, match=r"mine: no join point 'no_such_join_point_anywhere' exists"):
        ext.join_points(None, "no_such_join_point_anywhere", where="mine")
    assert ext.has_join_point(Loop, "loss") and not ext.has_join_point(Loop, "los")

    def plain(x: float) -> float:
        return x

    with pytest.raises(hw.UnknownEventError, match=r"'plain' has no join point 'loss'\. Its join points: \(none\)\. "
                                                   r"Make its code hookable with @hookwrap.hookable"):
        ext.join_points(plain, "loss")


def test_has_join_point_refuses_an_event_where_a_join_point_name_belongs(hw, ext):
    has_join_point = ext.has_join_point

    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, x):
            return x

    assert has_join_point(Loop, "loss") and not has_join_point(Loop, "los")
    with pytest.raises(hw.HookError, match=r"Pass the join point's name, 'loss', not the event 'post-loss'"):
        has_join_point(Loop, "post-loss")


def test_process_group_is_none_without_one_and_the_decisions_ask_it(hw, ext, monkeypatch):
    """One place asks whether a process group is up (``process_group``): the rank
    and the decisions of hookwrap.torch.distributed read it, never torch itself."""
    assert ext.process_group() is None
    monkeypatch.setenv("RANK", "2")
    assert ext.process_rank() == 2  # no group: torchrun's RANK
    pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
    distributed = importlib.import_module("hookwrap.torch.distributed")
    assert distributed.process_group is ext.process_group
    assert not distributed.is_distributed() and distributed.any_rank(True) and distributed.per_rank(5) == [5]
