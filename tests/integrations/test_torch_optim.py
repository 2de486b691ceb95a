"""The torch_optim preset: ``step`` of every torch.optim optimizer as a join point,
for optimizers created before and after the weave, with LR schedulers, overrides
and optimizer classes defined after the weave; ``remove()`` restores everything."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")

# Every optimizer class torch.optim exports (AdamW, a subclass of Adam, included).
OPTIMIZERS = sorted(
    (c for c in vars(torch.optim).values()
     if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer),
    key=lambda c: c.__name__,
)


def _preset(hw: Any) -> Any:
    return importlib.import_module("hookwrap.integrations.torch_optim")


def _model(cls: type) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    if cls is torch.optim.SparseAdam:  # sparse gradients only
        module = torch.nn.Embedding(10, 3, sparse=True)
        return module, lambda: module(torch.tensor([1, 2, 3])).sum()
    module = torch.nn.Linear(4, 3, bias=False)  # 2-D parameters only (Muon)
    return module, lambda: module(torch.ones(2, 4)).pow(2).sum()


def _steps(opt: Any, module: torch.nn.Module, loss_fn: Any, n: int, scheduler: Any = None) -> None:
    for _ in range(n):
        opt.zero_grad()
        if isinstance(opt, torch.optim.LBFGS):
            def closure() -> Any:
                opt.zero_grad()
                loss = loss_fn()
                loss.backward()
                return loss
            opt.step(closure)
        else:
            loss_fn().backward()
            opt.step()
        if scheduler is not None:
            scheduler.step()


def _originals() -> dict[type, Any]:
    return {c: vars(c).get("step") for c in [torch.optim.Optimizer, *OPTIMIZERS]}


def test_every_optimizer_class_is_listed():
    names = {c.__name__ for c in OPTIMIZERS}
    assert {"SGD", "Adam", "AdamW", "LBFGS", "SparseAdam", "Muon", "Adafactor"} <= names
    assert len(OPTIMIZERS) >= 15


@pytest.mark.parametrize("cls", OPTIMIZERS, ids=lambda c: c.__name__)
def test_each_optimizer_fires_once_per_step_created_before_and_after(hw, cls):
    preset = _preset(hw)
    before_module, before_loss = _model(cls)
    made_before = cls(before_module.parameters())  # its class is re-patched by torch first
    _steps(made_before, before_module, before_loss, 1)
    originals = _originals()
    seen: list[Any] = []
    handle = preset.weave_optimizers()
    try:
        assert cls in handle.classes or "step" not in vars(cls)
        hw.before(torch.optim.Optimizer, "step", lambda self: seen.append(self))
        _steps(made_before, before_module, before_loss, 3)
        after_module, after_loss = _model(cls)
        made_after = cls(after_module.parameters())
        _steps(made_after, after_module, after_loss, 2)
        assert seen == [made_before] * 3 + [made_after] * 2
    finally:
        handle.remove()
    assert _originals() == originals
    seen.clear()
    _steps(made_before, before_module, before_loss, 1)
    assert seen == []


def test_with_an_lr_scheduler_callbacks_fire_once_per_step(hw):
    preset = _preset(hw)
    counts = {"steps": 0}

    class Counter(hw.Callback):
        def pre_step(self, optimizer: Any) -> None:
            counts["steps"] += 1

    with preset.weave_optimizers(), Counter():
        module, loss_fn = _model(torch.optim.SGD)
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        assert hasattr(opt.step, "_wrapped_by_lr_sched")  # the scheduler wrapped it
        _steps(opt, module, loss_fn, 5, scheduler=sched)
        assert counts["steps"] == 5
        assert sched.last_epoch == 5 and opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 2)


def test_an_optimizer_whose_scheduler_was_made_before_the_weave_fires_once_per_step(hw):
    """An LR scheduler made before the weave wrapped the optimizer's plain step on the
    instance: without the weave's rewrapping no callback would ever fire for it. Now
    each step fires once, the schedule is torch's (and it never warns that the
    scheduler stepped first), and remove() gives the scheduler its own wrapper back."""
    import warnings

    preset = _preset(hw)
    module, loss_fn = _model(torch.optim.SGD)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    wrapper = vars(opt)["step"]
    counts = {"steps": 0}

    class Counter(hw.Callback):
        def pre_step(self, optimizer: Any) -> None:
            counts["steps"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()" would be one
        with preset.weave_optimizers(), Counter():
            _steps(opt, module, loss_fn, 5, scheduler=sched)
    assert counts["steps"] == 5
    assert sched.last_epoch == 5 and opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 2)
    assert vars(opt)["step"] is wrapper  # as the scheduler made it

def test_optimizer_classes_defined_after_the_weave_and_overrides(hw):
    preset = _preset(hw)
    seen: list[str] = []
    handle = preset.weave_optimizers()
    try:
        class Plain(torch.optim.Optimizer):
            def __init__(self, params: Any) -> None:
                super().__init__(params, {"lr": 0.1})

            @torch.no_grad()
            def step(self, closure: Any = None) -> None:
                for group in self.param_groups:
                    for p in group["params"]:
                        p.add_(p.grad, alpha=-group["lr"])

        class Clipped(torch.optim.SGD):  # an override calling super().step()
            def step(self, closure: Any = None) -> Any:
                return super().step(closure)

        class Inherits(torch.optim.Adam):  # no step of its own: Adam's join point
            pass

        assert {Plain, Clipped} <= set(handle.classes) and Inherits not in handle.classes
        hw.after(torch.optim.Optimizer, "step", lambda self: seen.append(type(self).__name__))
        for cls in (Plain, Clipped, Inherits):
            module, loss_fn = _model(cls)
            opt = cls(module.parameters()) if cls is Plain else cls(module.parameters(), lr=0.1)
            _steps(opt, module, loss_fn, 2)
        assert seen == ["Plain", "Plain", "Clipped", "Clipped", "Inherits", "Inherits"]
    finally:
        handle.remove()
    assert "__init_subclass__" not in vars(torch.optim.Optimizer)
    assert hw._joinpoints.join_point_of(vars(Clipped)["step"]) is None
    assert hw._joinpoints.join_point_of(vars(Plain)["step"]) is None


def test_shipped_step_timer_counts_every_optimizer_step(hw):
    from hookwrap.torch import StepTimer

    preset = _preset(hw)
    with preset.weave_optimizers(), StepTimer() as timer:
        for cls in (torch.optim.Adam, torch.optim.RMSprop):
            module, loss_fn = _model(cls)
            _steps(cls(module.parameters()), module, loss_fn, 4)
    assert timer.count == 8 and all(t > 0 for t in timer.times)


def test_a_second_weave_is_refused_and_remove_is_idempotent(hw):
    preset = _preset(hw)
    handle = preset.weave_optimizers()
    try:
        with pytest.raises(hw.HookError, match="already woven"):
            preset.weave_optimizers()
    finally:
        handle.remove()
    handle.remove()
    preset.weave_optimizers().remove()  # free again


def test_weaving_the_optimizer_base_class_fires_for_every_optimizer(hw):
    # hw.weave(torch.optim.Optimizer, "step") wove only the base's step, which
    # every optimizer class overrides: 0 of 5 SGD steps fired, and nothing said so.
    # The overrides are woven with it (an optimizer made before the weave included).
    chosen = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
    made = {cls: (cls(_model(cls)[0].parameters(), lr=0.1), *_model(cls)) for cls in chosen}
    classes = [torch.optim.Optimizer, *OPTIMIZERS]
    before = {cls: dict(vars(cls)) for cls in classes}  # after torch's profiler wrapped their step
    seen: list[str] = []
    with hw.weave(torch.optim.Optimizer, "step"):
        hw.after(torch.optim.Optimizer, "step", lambda self: seen.append(type(self).__name__))
        for cls in chosen:
            module, loss_fn = _model(cls)
            _steps(cls(module.parameters(), lr=0.1), module, loss_fn, 5)
        opt, module, loss_fn = made[torch.optim.SGD]
        opt.param_groups[0]["params"] = list(module.parameters())
        _steps(opt, module, loss_fn, 1)
        assert seen == ["SGD"] * 5 + ["Adam"] * 5 + ["AdamW"] * 5 + ["SGD"]
    assert {cls: dict(vars(cls)) for cls in classes} == before
    seen.clear()
    module, loss_fn = _model(torch.optim.SGD)
    _steps(torch.optim.SGD(module.parameters(), lr=0.1), module, loss_fn, 2)
    assert seen == []


def test_a_module_given_as_the_event_is_refused_naming_what_it_does(hw):
    from hookwrap.integrations.torch_optim import weave_optimizers

    with pytest.raises(ValueError, match=r"weave_optimizers\(event=Linear\(.*\): event is the name every "
                                         r"optimizer's step takes.*hw.add_callback\(optimizer, cb\)"):
        weave_optimizers(torch.nn.Linear(2, 1))
