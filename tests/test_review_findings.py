"""Review of b5f8a4d..b997b18 (issue 23: _policy/_codegen, registration owners,
hookwrap.extend): one test per finding. Each runs on both twins (``hw``)."""

from __future__ import annotations

import importlib
import linecache
import sys
import traceback
import types
from typing import Any

import pytest


@pytest.fixture
def ext(hw: Any) -> Any:
    return importlib.import_module("hookwrap.extend")


# --- Handle.active after the owner's registrations went away -------------------------


def test_review_handle_of_a_class_registration_is_inactive_once_its_weave_is_removed(hw):
    # README: "weave(...).remove() leaves the class as it was: the registrations made
    # on the woven class go with it." The handle must then say so.
    class Plain:
        def loss(self, x):
            return x

    seen = []
    woven = hw.weave(Plain, "loss")
    handle = hw.after(Plain, "loss", lambda self: seen.append(1))
    Plain().loss(1)
    assert seen == [1] and handle.active
    woven.remove()
    hw.weave(Plain, "loss")
    Plain().loss(1)
    assert seen == [1]  # the registration went with the weave...
    assert not handle.active  # ...so its handle is not active
    assert "removed" in repr(handle)


def test_review_handle_of_a_function_registration_is_inactive_once_its_weave_is_removed(hw, tmp_path, monkeypatch):
    (tmp_path / "review_woven_mod.py").write_text("def step(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("review_woven_mod", None)
    import review_woven_mod as mod

    seen = []
    woven = hw.weave(mod, "step")
    handle = hw.after(mod, "step", lambda: seen.append(1))
    mod.step(1)
    assert seen == [1] and handle.active
    woven.remove()
    mod.step(1)
    assert seen == [1]
    assert not handle.active


# --- generated code: file names made of user names -----------------------------------


def test_review_a_class_qualname_with_a_nul_does_not_break_its_calls(hw):
    # The compiled twin runs it; the pure twin put the qualname into the generated
    # runner's file name, which compile() refuses ("embedded null character").
    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, x):
            return x * 2

    Loop.__qualname__ = "Loop\x00v2"
    loop, seen = Loop(), []
    loop.after("loss", lambda self, x: seen.append(x))
    assert loop.loss(3) == 6 and seen == [3]


def test_review_a_listener_name_with_a_nul_does_not_break_emit(hw):
    # emit runners are generated on both twins (the traced path reads them).
    class Loop(hw.Hookable):
        emits = ("metrics",)

    def on_metrics(self, loss):
        seen.append(loss)

    on_metrics.__qualname__ = on_metrics.__name__ = "on\x00metrics"
    loop, seen = Loop(), []
    loop.on("metrics", on_metrics)
    loop.emit("metrics", loss=1.5)
    assert seen == [1.5]


def test_review_dispatch_function_source_survives_runner_churn(hw):
    # The dispatch functions live for the whole process and are in every traceback
    # through a hooked call of the pure twin; 256 later generated runners (a program
    # adding and removing callbacks per epoch) evict their lines from linecache.
    if hw.USING_EXTENSION:
        pytest.skip("the compiled twin generates no dispatch functions")
    codegen = hw._codegen

    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, x):
            return x

    loop = Loop()

    def fail(self, x):
        raise ValueError("bad")

    handle = loop.before("loss", fail)
    with pytest.raises(ValueError) as info:
        loop.loss(1)
    handle.remove()
    dispatch = [f.filename for f in traceback.extract_tb(info.value.__traceback__)
                if f.filename.startswith("<hookwrap dispatch")]
    assert dispatch and dispatch[0] in linecache.cache
    for i in range(codegen._SOURCES_KEPT + 1):
        codegen._define(f"def run():\n    return {i}\n", f"review churn {i}", {}, "run")
    assert dispatch[0] in linecache.cache


# --- hookwrap.extend -------------------------------------------------------------------


def test_review_reader_refuses_a_keyword_or_self_as_name_with_a_hook_error(hw, ext):
    # Documented: HookError for a name that is not an identifier / refused when
    # attached; got a bare ValueError from inspect.Parameter.
    class Logger(hw.Callback):
        def record(self, obj, value):
            pass

    logger = Logger()
    for name in ("class", "lambda", "self"):
        with pytest.raises(hw.HookError):
            ext.reader(logger.record, "post-", name)


def test_review_a_reader_registered_on_another_phase_is_refused_when_attached(hw, ext):
    # The module says "Everything here is checked when the callback is attached,
    # never per call"; a post- reader returned for a pre- event is accepted and
    # then fails every call with a CallbackReturnError telling the user to
    # `return x` from a handler whose return value the reader ignores.
    class Watch(hw.Callback):
        def event_methods(self, target):
            return [("pre-loss", ext.reader(self.see, "post-", "x"))]

        def see(self, obj, x):
            pass

    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, x):
            return x

    loop = Loop()
    with pytest.raises(hw.HookError):
        loop.add_callback(Watch())


@pytest.mark.parametrize("target", [42, object()], ids=["int", "object"])
def test_review_stateful_callbacks_refuses_what_has_no_join_points(hw, ext, target):
    # Its docstring: "Raises hookwrap.HookError for an obj that has no join points
    # to attach to." It returns {}.
    with pytest.raises(hw.HookError):
        ext.stateful_callbacks(target)


def test_review_evicting_a_generated_source_does_not_break_a_traceback_being_formatted(hw, monkeypatch):
    # CPython 3.11/3.12's linecache.getlines does `if name in cache: ... cache[name][2]`
    # without a lock; _codegen._define pops the oldest name from that shared dict
    # from whatever thread plans a new shape. This replays that interleaving
    # deterministically: another thread's planning evicts the very source a
    # traceback is being formatted from, and formatting raises KeyError.
    if hw.USING_EXTENSION:
        pytest.skip("the compiled twin generates no code")
    codegen = hw._codegen
    target = codegen._define("def run():\n    raise ValueError('x')\n", "review race", {}, "run")
    filename = target.__code__.co_filename
    evicted: list[int] = []

    class Interleaved(dict):  # type: ignore[type-arg]
        def __contains__(self, key: object) -> bool:
            found = super().__contains__(key)
            if found and key == filename and not evicted:
                evicted.append(1)  # "another thread" plans new shapes now
                for i in range(codegen._SOURCES_KEPT + 1):
                    codegen._define(f"def run():\n    return {i}\n", f"review race other {i}", {}, "run")
            return found

    monkeypatch.setattr(linecache, "cache", Interleaved(linecache.cache))
    with pytest.raises(ValueError) as info:
        target()
    text = "".join(traceback.format_exception(info.value))  # must not raise KeyError
    assert "ValueError" in text and evicted
