"""hookwrap.integrations itself: importing it imports no framework, PRESETS names
each preset's weave function for tools that look one up lazily, and the
documentation lists the presets its registry lists."""

from __future__ import annotations

import gc
import importlib
import logging
import re
import subprocess
import sys
import tomllib
import weakref
from pathlib import Path
from typing import Any

import pytest

from hookwrap.integrations import _REGISTRY as REGISTRY  # the presets, read at collection

ROOT = Path(__file__).resolve().parents[2]


def test_importing_hookwrap_and_the_registry_imports_no_framework(hw: Any) -> None:
    # Nor does looking up each preset's weave function (load imports its module).
    frameworks = sorted({preset.framework for preset in REGISTRY.values()})
    assert {"torch", "transformers", "lightning", "ignite", "accelerate"} <= set(frameworks)
    script = ("import sys, hookwrap, hookwrap.integrations as i; "
              f"loaded = [i.load(name) for name in {list(REGISTRY)!r}]; "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              f"{tuple(frameworks)!r}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", list(REGISTRY))
def test_presets_name_their_weave_functions(hw: Any, name: str) -> None:
    integrations = importlib.import_module("hookwrap.integrations")
    function = "weave_optimizers" if name == "torch_optim" else "weave"
    assert integrations.PRESETS[name] == f"hookwrap.integrations.{name}:{function}"
    assert integrations.load(name) is getattr(importlib.import_module(f"hookwrap.integrations.{name}"), function)
    with pytest.raises(hw.HookError, match=rf"no preset '{name[:-1]}'\. Did you mean '{name}'"):
        integrations.load(name[:-1])


def test_the_integrations_page_lists_every_preset_as_the_registry_does() -> None:
    # The table of presets on docs/guide/integrations.md: the registry's presets, in
    # its order, what each weaves and whether `hookwrap run --preset` applies it as
    # the CLI's help says, and the version the tests pin (tests/pins.txt), which its
    # extra's range in pyproject.toml admits.
    page = (ROOT / "docs" / "guide" / "integrations.md").read_text(encoding="utf-8")
    header = "| preset | weaves | `hookwrap run --preset` | tested with (extra) |\n|---|---|---|---|\n"
    assert page.count(header) == 1
    rows = [line.strip("| ").split(" | ") for line in page.split(header)[1].split("\n\n")[0].splitlines()]
    assert [row[0] for row in rows] == [f"`{name}`" for name in REGISTRY]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for (_, weaves, from_cli, tested), preset in zip(rows, REGISTRY.values()):
        assert weaves == preset.weaves
        assert from_cli.startswith("yes" if preset.from_cli else "no")
        pin, extra = re.fullmatch(r"`([^`]+)` \(`([\w-]+)`.*\)", tested).groups()  # type: ignore[union-attr]
        assert extra == preset.extra
        if extra == "torch":
            assert pin in extras[extra]  # torch's floor; the tests pin it on the command line
        else:
            assert pin in pins() and _admits(extras[extra], pin)


def test_each_frameworks_extra_holds_the_ranges_thirdparty_has() -> None:
    """``hookwrap[lightning]`` and the other per-framework extras install what the
    preset's framework needs, at the ranges of ``thirdparty`` (all the frameworks the
    tests weave): one range per package, whichever extra installs it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for preset in REGISTRY.values():
        if preset.extra in ("torch", "deepspeed"):
            continue
        assert extras[preset.extra] and set(extras[preset.extra]) <= set(extras["thirdparty"]), preset.extra


def pins() -> list[str]:
    lines = (ROOT / "tests" / "pins.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _admits(requirements: list[str], pin: str) -> bool:
    """Whether the extra ``requirements`` has the pinned package with a range holding its version."""
    from packaging.requirements import Requirement

    pinned = Requirement(pin)
    (version,) = [spec.version for spec in pinned.specifier]
    return any(Requirement(r).name == pinned.name and Requirement(r).specifier.contains(version)
               for r in requirements)


def test_the_extras_are_ranges_holding_the_versions_the_tests_pin() -> None:
    """Installing an extra never pins a user's stack to one version; every package of
    the thirdparty, loggers and deepspeed extras is pinned for the tests
    (tests/pins.txt, the constraints CI installs with), inside its range."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    from packaging.requirements import Requirement

    ranged = [Requirement(r) for name in ("thirdparty", "loggers", "deepspeed") for r in extras[name]]
    assert all(not any(spec.operator == "==" for spec in r.specifier) and r.specifier for r in ranged)
    assert sorted(Requirement(pin).name for pin in pins()) == sorted(r.name for r in ranged)
    for pin in pins():
        assert _admits([str(r) for r in ranged], pin), pin


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


def test_the_reference_page_documents_every_preset_module() -> None:
    page = (ROOT / "docs" / "reference" / "integrations.md").read_text(encoding="utf-8")
    modules = re.findall(r"^::: hookwrap\.integrations\.(\w+)$", page, flags=re.M)
    assert sorted(set(modules) - {"arctic_training"}) == sorted(
        preset.weave.partition(":")[0].rpartition(".")[2] for preset in REGISTRY.values())


@pytest.mark.third_party
def test_a_preset_records_that_it_was_applied_and_removed(hw: Any, caplog: Any) -> None:
    """hookwrap's own record (logging.getLogger("hookwrap"), INFO) says which preset
    was applied, and when it was removed."""
    pytest.importorskip("ignite", reason="needs the thirdparty extra (pytorch-ignite)")
    caplog.set_level(logging.INFO, logger="hookwrap")
    with importlib.import_module("hookwrap.integrations").load("ignite")() as handle:
        assert handle.applied
    said = [r.getMessage() for r in caplog.records if r.name == "hookwrap.integrations._weaving"]
    assert said == ["preset ignite Engine applied", "preset ignite Engine removed"]


@pytest.mark.parametrize("name", [name for name, preset in REGISTRY.items() if preset.framework != "torch"])
def test_a_preset_without_its_framework_says_what_to_install(hw: Any, monkeypatch: pytest.MonkeyPatch,
                                                             name: str) -> None:
    """In Python as on the command line: not a bare ModuleNotFoundError from inside
    the preset, but the extra to install, torch pinned to the one installed here."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    framework = REGISTRY[name].framework
    for module in [m for m in sys.modules if m == framework or m.startswith(framework + ".")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, framework, None)  # as if it were not installed
    weave = importlib.import_module("hookwrap.integrations").load(name)
    with pytest.raises(ModuleNotFoundError) as raised:
        weave(object) if name == "lightning" else weave()
    try:  # the torch installed here, pinned; without one, a placeholder that says so
        torch_pin = "torch==" + version("torch").split("+")[0]
    except PackageNotFoundError:
        torch_pin = "torch==<the torch version you use>"
    assert f"hookwrap.integrations.{name} weaves {framework}, and {framework} is not installed here" \
        in str(raised.value)
    assert f"'hookwrap[{REGISTRY[name].extra}]' {torch_pin}" in str(raised.value)
    assert raised.value.name is not None and raised.value.name.split(".")[0] == framework
