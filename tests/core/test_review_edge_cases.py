"""Edge cases an adversarial review of the issue-23 changes found (_policy/_codegen,
registration owners, hookwrap.extend): one test per finding, on both twins (``hw``)."""

from __future__ import annotations

import linecache
import sys
import traceback

import pytest


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
    codegen = hw._fast_py

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
    for i in range(300):
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
def test_review_stateful_callbacks_of_what_has_no_join_points_is_empty(hw, ext, target):
    # As hookwrap.callback_state: nothing attached, nothing to save (documented so).
    assert ext.stateful_callbacks(target) == {}
    assert hw.callback_state(target) == {}


def test_review_generating_code_never_removes_a_linecache_entry(hw, monkeypatch):
    # Removing one would race another thread's traceback (3.11/3.12's
    # linecache.getlines reads `name in cache`, then `cache[name]`, unlocked).
    codegen = hw._fast_py
    monkeypatch.setattr(codegen, "_SOURCES_KEPT", len(codegen._sources) + 10)
    before = dict(linecache.cache)
    for i in range(50):  # past the bound
        codegen._define(f"def run():\n    return {i} + {id(hw)}\n", f"review no removal {i}", {}, "run")
    assert all(name in linecache.cache for name in before)
    added = [n for n in linecache.cache if n not in before]
    assert len(added) == 10 and all(n.startswith("<hookwrap review no removal ") for n in added)
