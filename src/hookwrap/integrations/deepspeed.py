"""DeepSpeed (``deepspeed.DeepSpeedEngine``): your own loop over the engine
``deepspeed.initialize`` returns, with the engine's calls as its join points:

```python
from hookwrap.integrations import deepspeed as hw_deepspeed
preset = hw_deepspeed.weave()
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
hw.add_callback(engine, GradNorm(logger=log))        # DeepSpeed's own norm, once per update
for batch in loader:
    loss = engine(batch)
    engine.backward(loss)
    engine.step()                                    # an update at each accumulation boundary
```

Events, of the engine (DeepSpeed 0.19):

| event | what it is |
|---|---|
| ``forward`` | ``engine(...)``: ``DeepSpeedEngine.forward`` (arguments ``inputs``, ``kwargs``) |
| ``backward`` | ``engine.backward(loss, ...)``: callbacks read ``loss`` (``NanGuard(events="backward")``, a loss-scaling ``before`` callback) |
| ``optimizer_step`` | ``engine.step()`` at a gradient accumulation boundary: one per update, as DeepSpeed's ``global_steps`` counts; the calls in between (DeepSpeed only counts the micro-batch) run without callbacks |

A step is one update: every counting callback numbers by ``engine.global_steps``.
Under ZeRO DeepSpeed holds the gradients (stages 1 and 2 partition them, stage 3 the
parameters too: ``p.grad`` is empty or partial), so ``GradNorm`` reports the norm
DeepSpeed computed for the update (``engine.get_global_grad_norm()``, what HF's
``Trainer`` logs as ``grad_norm`` there) and ``GradClip`` is refused, naming DeepSpeed's
``gradient_clipping``; without ZeRO (stage 0) they read and clip ``p.grad`` after the
last ``backward`` of the update. DeepSpeed accumulates and scales (``fp16``) itself:
``GradAccumulation`` and ``GradScaler`` are refused, naming its config.
``hw.StopTraining`` propagates into your loop.

``engine.save_checkpoint(dir)`` writes the callbacks' state beside DeepSpeed's files
(``dir/<tag>/hookwrap_callbacks.pt``, plain data) and ``engine.load_checkpoint(dir)``
gives it back (read with ``torch.load(weights_only=True)``): best values, patience
and counters go on from where they were, as the weights do.
"""

from __future__ import annotations

import os
from typing import Any

from . import needs_framework
from ._weaving import (PresetHandle, accumulates, counts_updates, holds_gradients, patch, resume_from_folder, routed,
                       save_into_folder, scales_loss, stage, target_class)

__all__ = ["weave"]

# How to accumulate gradients, clip and scale them here: what GradAccumulation names.
ACCUMULATION = ('the DeepSpeed config\'s "gradient_accumulation_steps" (and "gradient_clipping", "fp16"): '
                "DeepSpeed accumulates, clips and scales the gradients it holds")


@needs_framework("deepspeed")
def weave(engine: Any = None) -> PresetHandle:
    """Weave ``deepspeed.DeepSpeedEngine`` (or ``engine``: a subclass, or an instance of
    one, whose class is woven). Returns a handle whose ``remove()`` restores everything."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    cls = target_class(engine, DeepSpeedEngine, "hookwrap.integrations.deepspeed.weave()",
                       "a DeepSpeedEngine class")
    handle = PresetHandle(f"deepspeed {cls.__qualname__}")
    with handle.building():
        stage(handle, cls, "forward", "forward")
        stage(handle, cls, "backward", "backward")
        optimizer_step = routed(handle, cls, "optimizer_step", cls, "step", _updating)
        accumulates(handle, cls, optimizer_step, ACCUMULATION)  # GradAccumulation refuses, naming it
        # A micro-batch begins with its forward (or its backward); global_steps counts the updates done.
        counts_updates(handle, cls, optimizer_step, ("forward", "backward"), _global_steps,
                       "engine.global_steps")
        holds_gradients(handle, cls, _grad_norm)
        # Without ZeRO, "torch_autocast" in float16 scales the loss with a torch.amp.GradScaler
        # of DeepSpeed's own: p.grad, which GradNorm reads there, is scaled until step().
        scales_loss(handle, cls, _autocast_scaler)
        _checkpoint_callbacks(handle, cls)
    return handle


def _updating(engine: Any) -> Any:
    """The engine, when this ``step()`` call is an update (an accumulation boundary);
    else None: DeepSpeed only counts the micro-batch."""
    managed = getattr(engine, "managed_gradient_accumulation", None)
    if managed is not None and not managed():
        return engine  # unmanaged accumulation: every step() is the boundary
    return engine if engine.is_gradient_accumulation_boundary() else None


def _autocast_scaler(engine: Any) -> Any:
    """The GradScaler DeepSpeed scales the loss with on ZeRO 0 under float16 torch_autocast, else None."""
    return getattr(engine, "torch_autocast_z0_gradscaler", None)


def _global_steps(engine: Any) -> Any:
    return engine.global_steps


def _grad_norm(engine: Any) -> Any:
    """Under ZeRO, DeepSpeed's norm of the latest update; without (stage 0) the
    parameters hold the gradients until ``step()``, and GradNorm reads them."""
    return engine.get_global_grad_norm if engine.zero_optimization_stage() else None


STATE_FILE = "hookwrap_callbacks.pt"


def _checkpoint_callbacks(handle: PresetHandle, cls: type) -> None:
    """The callbacks' state rides on DeepSpeed's checkpoints: written into the tag's
    folder by ``save_checkpoint``, given back by ``load_checkpoint``."""

    def make_save(original: Any, layer: Any) -> Any:
        def save_checkpoint(self: Any, save_dir: Any, tag: Any = None, *args: Any, **kwargs: Any) -> Any:
            folder = os.path.join(save_dir, f"global_step{self.global_steps}" if tag is None else str(tag))
            result = original(self, save_dir, tag, *args, **kwargs)
            if not layer.removed:
                save_into_folder(self, folder, STATE_FILE, "hookwrap.integrations.deepspeed", self.global_rank == 0)
            return result
        return save_checkpoint

    def make_load(original: Any, layer: Any) -> Any:
        def load_checkpoint(self: Any, load_dir: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, load_dir, *args, **kwargs)
            load_path = result[0] if isinstance(result, tuple) and result else None
            if not layer.removed and load_path is not None:
                resume_from_folder(self, os.path.dirname(load_path), STATE_FILE)
            return result
        return load_checkpoint

    patch(handle, cls, "save_checkpoint", make_save)
    patch(handle, cls, "load_checkpoint", make_load)
