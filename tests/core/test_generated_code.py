"""Generated code (_fast_py) reads like code: a traceback through it names what
it runs and shows its lines, and what it keeps for that is bounded."""

from __future__ import annotations

import linecache
import traceback

import pytest


def _pure_only(hw):
    if hw.USING_EXTENSION:
        pytest.skip("the compiled twin generates no code")


def test_a_traceback_through_a_generated_runner_shows_its_source(hw):
    _pure_only(hw)

    class Trainer(hw.Hookable):
        @hw.hookable("loss")
        def compute_loss(self, batch, scale=1.0):
            return sum(batch) * scale

    trainer = Trainer()

    @trainer.before("loss")
    def check(self, batch):
        raise ValueError("bad batch")

    with pytest.raises(ValueError) as info:
        trainer.compute_loss([1, 2])
    frames = traceback.extract_tb(info.value.__traceback__)
    runner = [f for f in frames if f.filename.startswith("<hookwrap runner of 'loss' on ")]
    assert len(runner) == 1, [f.filename for f in frames]
    assert "Trainer, 2 positional #" in runner[0].filename  # the object and the batch
    assert runner[0].line == "r = FP0(obj, a1)"  # the callback's call, as generated
    text = "".join(traceback.format_exception(info.value))
    assert "r = FP0(obj, a1)" in text


def test_a_traceback_through_an_emit_runner_names_its_listener(hw):
    _pure_only(hw)

    class Loop(hw.Hookable):
        emits = ("metrics",)

    loop = Loop()

    def on_metrics(self, loss):
        raise RuntimeError("logger down")

    loop.on("metrics", on_metrics)
    with pytest.raises(RuntimeError) as info:
        loop.emit("metrics", loss=1.0)
    frames = [f for f in traceback.extract_tb(info.value.__traceback__) if f.filename.startswith("<hookwrap emit")]
    assert len(frames) == 1 and "on_metrics" in frames[0].filename
    assert frames[0].line == "r = F0(target, loss=kwargs['loss'])"


def test_the_same_code_generated_again_keeps_one_entry_and_new_code_stops_at_the_bound(hw, monkeypatch):
    codegen = hw._fast_py
    monkeypatch.setattr(codegen, "_sources", set())
    monkeypatch.setattr(codegen, "_SOURCES_KEPT", 5)
    for _ in range(3):  # a chain planned again (callbacks added and removed each epoch)
        again = codegen._define(f"def run():\n    return {id(hw)}\n", "test again", {}, "run")
    assert len(codegen._sources) == 1 and again.__code__.co_filename in linecache.cache
    made = [codegen._define(f"def run():\n    return {id(hw)} + {i}\n", f"test new {i}", {}, "run")
            for i in range(10)]
    assert len(codegen._sources) == 5  # the bound: later code runs, unregistered
    assert [run() for run in made] == [id(hw) + i for i in range(10)]
    kept = [run.__code__.co_filename in linecache.cache for run in made]
    assert kept == [True] * 4 + [False] * 6
    monkeypatch.setattr(linecache, "cache", {})  # another tool cleared it: a name kept comes back
    codegen._define(f"def run():\n    return {id(hw)}\n", "test again", {}, "run")
    assert again.__code__.co_filename in linecache.cache


def test_inspect_on_a_generated_function_never_caches_another_files_lines_under_its_name(hw):
    """inspect reads a function's source through its module's loader: generated
    code names no module, so no other file's lines are cached under its name."""
    import inspect

    codegen = hw._fast_py
    run = codegen._define("def run():\n    return 1\n", "inspected", {}, "run")
    try:
        inspect.getsource(run)
    except OSError:
        pass  # no source through a module: fine, as long as nothing wrong is cached
    assert linecache.getlines(run.__code__.co_filename, run.__globals__)[0] == "def run():\n"


def test_a_name_with_a_newline_or_nul_is_escaped_and_a_long_one_cut(hw):
    codegen = hw._fast_py
    run = codegen._define("def run():\n    return 2\n", "odd\nname\x00" + "x" * 500, {}, "run")
    name = run.__code__.co_filename
    assert "\n" not in name and "\x00" not in name and "odd\\nname\\x00" in name
    assert len(name) < 260 and run() == 2
