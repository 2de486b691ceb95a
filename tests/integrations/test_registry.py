"""hookwrap.integrations itself: importing it imports no framework, and PRESETS names
each preset's weave function for tools that look one up lazily."""

from __future__ import annotations

import gc
import importlib
import subprocess
import sys
import weakref
from typing import Any

import pytest


def test_importing_hookwrap_and_the_registry_imports_no_framework(hw: Any) -> None:
    script = ("import sys, hookwrap, hookwrap.integrations as i; "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('torch', 'transformers', 'lightning', 'ignite', 'accelerate')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_presets_name_their_weave_functions(hw: Any) -> None:
    integrations = importlib.import_module("hookwrap.integrations")
    assert {"transformers", "lightning", "ignite", "accelerate", "fabric"} <= set(integrations.PRESETS)
    for name in ("transformers", "lightning", "ignite", "accelerate", "fabric"):
        assert integrations.PRESETS[name] == f"hookwrap.integrations.{name}:weave"
    with pytest.raises(hw.HookError, match=r"no preset 'lightnin'\. Did you mean 'lightning'"):
        integrations.load("lightnin")


@pytest.mark.third_party
def test_load_returns_the_weave_function(hw: Any) -> None:
    pytest.importorskip("ignite", reason="needs the thirdparty extra (pytorch-ignite)")
    integrations = importlib.import_module("hookwrap.integrations")
    weave = integrations.load("ignite")
    assert weave is importlib.import_module("hookwrap.integrations.ignite").weave
    with weave() as handle:
        assert handle.applied and "step" in handle.events
    assert not handle.applied


@pytest.mark.parametrize("first_removed", ["stage", "routed"])
@pytest.mark.parametrize("first_woven", ["stage", "routed"])
def test_two_presets_on_one_method_remove_in_any_order(hw: Any, first_woven: str, first_removed: str) -> None:
    # As accelerate's preset (a stage of Accelerator.backward) and transformers' (a
    # router of it to the trainer) do: each remove() leaves the other's events
    # firing, and after both the method is the original. A removed preset's wrapper
    # held elsewhere (torch's LR schedulers wrap optimizer.step per instance) runs
    # the method it replaced.
    weaving = importlib.import_module("hookwrap.integrations._weaving")

    class Engine:
        def backward(self, loss: float) -> float:
            return loss * 2

    class Loop:
        def __init__(self) -> None:
            self.engine = Engine()
            self.engine.loop = self  # type: ignore[attr-defined]

    original, before = Engine.__dict__["backward"], dict(vars(Engine))

    def weave_stage() -> Any:
        handle = weaving.PresetHandle("stage")
        weaving.stage(handle, Engine, "backward", "backward")
        return handle

    def weave_routed() -> Any:
        handle = weaving.PresetHandle("routed")
        weaving.routed(handle, Loop, "backward", Engine, "backward", lambda engine: getattr(engine, "loop", None))
        return handle

    makers = {"stage": weave_stage, "routed": weave_routed}
    handles = {name: makers[name]() for name in sorted(makers, key=lambda name: name != first_woven)}
    held = Engine.backward  # the wrapper on top, kept as a scheduler keeps it
    wrappers = [weakref.ref(held)]
    loop, seen = Loop(), []
    hw.after(loop.engine, "backward", lambda self, loss: seen.append(("stage", loss)))
    hw.after(loop, "backward", lambda self, loss: seen.append(("routed", loss)))
    assert loop.engine.backward(1.0) == 2.0 and sorted(seen) == [("routed", 1.0), ("stage", 1.0)]
    handles.pop(first_removed).remove()
    kept = "routed" if first_removed == "stage" else "stage"
    for call in (loop.engine.backward, lambda loss: held(loop.engine, loss)):
        seen.clear()
        assert call(3.0) == 6.0 and seen == [(kept, 3.0)]
    with pytest.raises(hw.UnknownEventError):
        hw.before(loop.engine if first_removed == "stage" else loop, "backward", lambda self: None)
    handles.pop(kept).remove()
    assert Engine.__dict__["backward"] is original and dict(vars(Engine)) == before
    seen.clear()
    assert loop.engine.backward(4.0) == 8.0 and held(loop.engine, 4.0) == 8.0 and seen == []
    assert dict(vars(Engine)) == before
    del held
    gc.collect()
    assert [ref() for ref in wrappers] == [None]  # a removed wrapper (and its join point) is freed
