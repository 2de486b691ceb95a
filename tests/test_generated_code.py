"""The pure twin's generated code (_codegen) reads like code: a traceback through
it names what it runs and shows its lines, and what it keeps is bounded."""

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


def test_generated_sources_kept_for_tracebacks_are_bounded(hw):
    _pure_only(hw)
    codegen = hw._codegen
    for i in range(codegen._SOURCES_KEPT + 40):
        run = codegen._define(f"def run():\n    return {i}\n", f"test source {i}", {}, "run")
        assert run() == i
    kept = list(codegen._sources)  # (other loads of hookwrap in this session keep their own)
    assert len(kept) == codegen._SOURCES_KEPT and all(name in linecache.cache for name in kept)
    assert kept[-1].startswith(f"<hookwrap test source {codegen._SOURCES_KEPT + 39} #")
    ours = [name for name in linecache.cache if name.startswith("<hookwrap test source ")]
    assert len(ours) == codegen._SOURCES_KEPT  # the 40 oldest were dropped from linecache too
    assert not any(name.startswith("<hookwrap test source 39 #") for name in ours)
    assert any(name.startswith("<hookwrap test source 40 #") for name in ours)
