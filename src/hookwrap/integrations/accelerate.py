"""Hugging Face ``accelerate``: your own loop, with the ``Accelerator``'s calls as
join points of the accelerator:

```python
from hookwrap.integrations import accelerate as hw_accelerate
preset = hw_accelerate.weave()
hw.add_callback(accelerator, NanGuard(events=("backward",)))   # checks `loss`
for batch in loader:
    ...
    accelerator.backward(loss)
    optimizer.step()
```

Events, of the accelerator (accelerate 1.x):

| event | what it is |
|---|---|
| ``backward`` | ``Accelerator.backward(loss, **kwargs)``: callbacks read ``loss`` (``NanGuard``, a loss-scaling ``before`` callback); ``GradNorm(model=...)`` after it |
| ``optimizer_step`` | ``step()`` of an optimizer prepared by this accelerator (``AcceleratedOptimizer.step``, routed to the accelerator that prepared it; ``LRMonitor(optimizer=...)`` after it), once per real update: under ``accelerator.accumulate(model)`` the calls accelerate skips (gradients not synchronized yet) run without callbacks, so EMA, LRMonitor and the step counts follow the updates, as ``accelerator.step`` does; with a ``DeepSpeedPlugin``, accelerate's no-op ``DeepSpeedOptimizerWrapper.step`` once per update (DeepSpeed ran it inside ``backward``), where ``GradNorm`` reports DeepSpeed's norm |

State: ``accelerator.register_for_checkpointing(hw.CallbackState(accelerator))`` saves
the callbacks' state with ``accelerator.save_state``; with the preset woven,
``accelerator.load_state`` reads it with ``torch.load(weights_only=True)`` (accelerate
itself loads a registered object's state with ``weights_only=False``).

The loop is yours, so ``fit``, ``epoch``, ``step`` and ``evaluate`` are your
functions: decorate them with ``@hw.hookable`` and the shipped callbacks find them.

``hw.StopTraining`` (``EarlyStopping`` on your ``evaluate``, a callback here): with
``stop="raise"`` (the default) it propagates out of the call that raised it into
your loop, as in any hookwrap loop; catch it where the run should end. Under several
processes a rank that stops alone leaves the others waiting in a collective, so
there pass ``stop="trigger"``: a StopTraining raised in ``backward`` or
``optimizer_step`` callbacks calls ``accelerator.set_trigger()`` instead, the call
completes, and your loop ends on every rank together with accelerate's own check:

```python
if accelerator.check_trigger():
    break
```
"""

from __future__ import annotations

import weakref
from typing import Any, cast

from .. import CallbackState

from ..errors import HookError, StopTraining
from . import needs_framework
from ._weaving import (PresetHandle, _raw, _set, accumulates, counts_updates, holds_gradients, routed, scales_loss,
                       stage, target_class)

__all__ = ["weave"]

# How to accumulate gradients here: GradAccumulation, which cannot, names it.
ACCUMULATION = "Accelerator(gradient_accumulation_steps=N) with `with accelerator.accumulate(model):`"


@needs_framework("accelerate")
def weave(accelerator: Any = None, *, stop: str = "raise") -> PresetHandle:
    """Weave ``accelerate.Accelerator`` (or ``accelerator``: a subclass, or an instance of
    one). ``stop``: ``"raise"`` or ``"trigger"`` (see the module). Returns a handle whose
    ``remove()`` restores everything."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.utils.deepspeed import DeepSpeedOptimizerWrapper

    where = "hookwrap.integrations.accelerate.weave()"
    if stop not in ("raise", "trigger"):
        raise HookError(f"{where}: stop must be 'raise' (StopTraining propagates to your loop) or "
                        f"'trigger' (accelerator.set_trigger(); check accelerator.check_trigger()), got {stop!r}.")
    cls = target_class(accelerator, Accelerator, where, "an accelerate Accelerator class")
    handle = PresetHandle(f"accelerate {cls.__qualname__}")
    owners: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # optimizer -> ref(accelerator)

    def trigger(owner: Any, exc: StopTraining) -> bool:
        owner.set_trigger()
        return True

    prepare_optimizer = _raw(cls, "prepare_optimizer", where)

    def prepare(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        prepared = prepare_optimizer(self, optimizer, *args, **kwargs)
        owners[prepared] = weakref.ref(self)
        return prepared

    prepare_deepspeed = _raw(cls, "_prepare_deepspeed", where)

    def prepare_on_deepspeed(self: Any, *args: Any) -> Any:
        # DeepSpeed's prepare wraps the optimizer itself (DeepSpeedOptimizerWrapper), not
        # through prepare_optimizer.
        prepared = prepare_deepspeed(self, *args)
        for item in prepared:
            if isinstance(item, AcceleratedOptimizer):
                owners[item] = weakref.ref(self)
        return prepared

    def optimizer_owner(optimizer: Any) -> Any:
        ref = owners.get(optimizer)
        if ref is None or not optimizer.gradient_state.sync_gradients:
            return None  # accumulating: accelerate skips this call, so it is no optimizer step
        return ref()

    options: dict[str, Any] = {"stop": trigger} if stop == "trigger" else {}
    import accelerate.accelerator as accelerator_module

    load_custom_state = accelerator_module.load_custom_state

    def load_custom_state_(obj: Any, path: Any, index: int = 0, *args: Any, **kwargs: Any) -> None:
        # accelerate loads a registered object's state with weights_only=False; hookwrap's
        # own (hw.CallbackState) is plain data, read so: never code from the folder.
        if not isinstance(obj, CallbackState):
            load_custom_state(obj, path, index, *args, **kwargs)
            return None
        from ..extend import weights_only_load

        location = f"{path}/custom_checkpoint_{index}.pkl"
        obj.load_state_dict(weights_only_load(location, location, "cpu"))
        return None

    with handle.building():
        _set(handle, cast(Any, accelerator_module), "load_custom_state", load_custom_state_)
        _set(handle, cls, "prepare_optimizer", prepare)
        _set(handle, cls, "_prepare_deepspeed", prepare_on_deepspeed)
        stage(handle, cls, "backward", "backward", **options)
        # On DeepSpeed, backward runs the update at the accumulation boundary and
        # optimizer.step() is DeepSpeedOptimizerWrapper's no-op: still one call per update.
        optimizer_step = routed(handle, cls, "optimizer_step", AcceleratedOptimizer, "step", optimizer_owner,
                                also=(DeepSpeedOptimizerWrapper,), **options)
        accumulates(handle, cls, optimizer_step, ACCUMULATION)  # GradAccumulation refuses, naming it
        # A batch begins with its backward; the optimizer.step() calls accelerate skips count nothing.
        counts_updates(handle, cls, optimizer_step, ("backward",), None, "optimizer.step() calls accelerate runs")
        scales_loss(handle, cls, lambda accelerator: accelerator.scaler)  # mixed_precision="fp16"
        holds_gradients(handle, cls, _deepspeed_grad_norm)  # ZeRO: DeepSpeed's own norm
    return handle


def _deepspeed_grad_norm(accelerator: Any) -> Any:
    """On DeepSpeed, its engine's norm of the latest update's gradients (what
    ``accelerator.clip_grad_norm_`` returns there); else None."""
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    return None if wrapped is None else wrapped.engine.get_global_grad_norm
