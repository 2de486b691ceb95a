"""describe() and weave()."""

from __future__ import annotations

import sys
import types

import pytest


def test_describe_lists_the_chain_in_order_with_origins(hw):
    def listed(self, batch):
        return batch

    class Trainer(hw.Hookable):
        callbacks = [("pre-step", listed)]

        @hw.hookable
        def step(self, batch):
            return batch

        def post_step_callback(self, return_value):
            return return_value

    t = Trainer()
    t.after("step", lambda self: None, every=2)
    with hw.register_global_callback(("pre-step", lambda self: None)):
        text = str(hw.describe(t, "step"))
    lines = text.splitlines()
    assert lines[0] == "Trainer (instance)" or lines[0].endswith("Trainer (instance)")
    assert lines[1] == "  step"
    assert "1. pre-step" in lines[2] and "listed" in lines[2] and "class list" in lines[2]
    assert "2. pre-step" in lines[3] and "<- global" in lines[3]
    assert "3. post-step" in lines[4] and "post_step_callback" in lines[4] and "class method" in lines[4]
    assert "4. post-step" in lines[5] and "[every=2]" in lines[5] and "<- instance" in lines[5]
    whole = hw.describe(Trainer)
    assert set(whole.chains) == {"init", "step"}
    assert "(no callbacks)" in str(whole)


def test_describe_function_and_unknown_event(hw):
    @hw.hookable
    def train_step(batch):
        return batch

    train_step.before(lambda batch: batch)
    assert "pre-train_step" in str(hw.describe(train_step))

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self):
            pass

    with pytest.raises(hw.UnknownEventError, match="Did you mean 'step'"):
        hw.describe(Trainer(), "stpe")


def test_describe_one_event_and_structured_sources(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            return batch

        def pre_step_callback(self, batch):
            return batch

    t = Trainer()
    t.after("step", lambda self: None)
    hw.before(Trainer, "step", lambda self: None)
    pre = hw.describe(t, "pre-step")
    assert list(pre.chains) == ["pre-step"]
    entries = pre.chains["pre-step"]
    assert [e.phase for e in entries] == ["pre", "pre"]
    assert [(e.source.tier, e.source.kind) for e in entries] == [("class", "method"), ("class", "registered")]
    assert entries[0].source.attr == "pre_step_callback" and entries[0].source.owner.endswith("<locals>.Trainer")
    assert "1. pre-step" in str(pre) and "pre-pre" not in str(pre)
    post = hw.describe(t, "post-step").chains["post-step"]
    assert [e.source.tier for e in post] == ["instance"]
    assert set(hw.describe(t, "step").chains) == {"step"}  # the join point: every phase
    with pytest.raises(hw.UnknownEventError, match="Did you mean 'step'"):
        hw.describe(t, "pre-stpe")

    @hw.hookable
    def train_step(batch):
        return batch

    train_step.after(lambda return_value: return_value)
    assert [e.phase for e in hw.describe(train_step, "post-train_step").chains["post-train_step"]] == ["post"]
    assert hw.describe(train_step, "pre-train_step").chains["pre-train_step"] == []
    with pytest.raises(hw.UnknownEventError, match="its events are 'pre-train_step'"):
        hw.describe(train_step, "pre-other")


class ThirdParty:
    """A trainer we cannot edit."""

    def step(self, batch):
        return batch + 1

    @classmethod
    def build(cls, n):
        return n


def test_weave_a_class_and_restore_it_exactly(hw):
    original = ThirdParty.__dict__["step"]
    original_build = ThirdParty.__dict__["build"]
    attributes = set(vars(ThirdParty))
    handle = hw.weave(ThirdParty, "step", "build")
    try:
        t = ThirdParty()
        hw.before(t, "step", lambda self, batch: batch * 10)
        hw.before(ThirdParty, "build", lambda cls, n: n + 1)
        assert t.step(1) == 11
        assert ThirdParty().step(1) == 2
        assert ThirdParty.build(1) == 2
        assert ThirdParty.step.__doc__ is None and ThirdParty.step.__name__ == "step"
    finally:
        handle.remove()
    handle.remove()
    assert ThirdParty.__dict__["step"] is original
    assert ThirdParty.__dict__["build"] is original_build
    assert set(vars(ThirdParty)) == attributes  # nothing of hookwrap's is left in it
    with pytest.raises(hw.UnknownEventError):
        hw.before(ThirdParty, "step", lambda self: None)


def test_weave_errors(hw):
    with pytest.raises(hw.HookError, match=r"has no attribute 'stpe' to weave"):
        hw.weave(ThirdParty, "stpe")
    with pytest.raises(hw.HookError, match=r"name the methods or functions"):
        hw.weave(ThirdParty)
    with hw.weave(ThirdParty, "step"):
        with pytest.raises(hw.HookError, match=r"'step' is already a join point"):
            hw.weave(ThirdParty, "step")
    with pytest.raises(hw.HookError, match=r"must be a class, a module"):
        hw.weave(3, "x")


def test_weave_a_module_lazily_without_importing_it(hw, tmp_path, monkeypatch):
    pkg = tmp_path / "lazy_trainer_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "loop.py").write_text(
        "class Trainer:\n"
        "    def step(self, batch):\n"
        "        return batch\n"
        "def train_step(batch):\n"
        "    return batch\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    handle = hw.weave("lazy_trainer_pkg.loop:Trainer", "step")
    module_handle = hw.weave("lazy_trainer_pkg.loop", "train_step")
    assert "lazy_trainer_pkg.loop" not in sys.modules
    assert "pending import" in repr(handle)
    try:
        from lazy_trainer_pkg import loop

        assert handle.applied and module_handle.applied
        hw.before(loop.Trainer, "step", lambda self, batch: batch + 1)
        hw.before(loop, "train_step", lambda batch: batch * 3)
        assert loop.Trainer().step(1) == 2
        assert loop.train_step(2) == 6
    finally:
        handle.remove()
        module_handle.remove()
        for name in ["lazy_trainer_pkg.loop", "lazy_trainer_pkg"]:
            sys.modules.pop(name, None)
    assert loop.Trainer().step(1) == 1
    assert loop.train_step(2) == 2


def test_weave_already_imported_module(hw):
    module = types.ModuleType("already_here")
    exec("def f(x):\n    return x\n", module.__dict__)
    sys.modules["already_here"] = module
    try:
        with hw.weave("already_here", "f") as handle:
            assert handle.applied
            hw.after(module, "f", lambda return_value: return_value * 2)
            assert module.f(4) == 8
        assert module.f(4) == 4
    finally:
        del sys.modules["already_here"]


def test_a_subclass_overriding_a_woven_method_is_named_at_registration(hw):
    class Library:
        def step(self, batch):
            return batch + 1

    with hw.weave(Library, "step"):

        class Override(Library):  # defined after the weave (one defined before is woven with it)
            def step(self, batch):
                return super().step(batch) * 2

        hw.before(Library(), "step", lambda self, batch: batch)  # the woven class itself: fine
        with pytest.raises(hw.HookError, match=r"Override overrides step\(\) of .*Library.*hookwrap.weave\(.*Override, 'step'\)"):
            hw.before(Override(), "step", lambda self, batch: batch)
        with hw.weave(Override, "step"):  # as the message says
            obj = Override()
            hw.before(obj, "step", lambda self, batch: batch * 10)
            assert obj.step(1) == 22
    assert Override().step(1) == 4
