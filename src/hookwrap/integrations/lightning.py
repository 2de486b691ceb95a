"""Lightning (``lightning.pytorch``), woven in one call on your ``LightningModule``:

```python
from hookwrap.integrations import lightning as hw_pl
preset = hw_pl.weave(MyModule)           # the class you instantiate
hw.add_callback(module, EarlyStopping("val_loss", patience=2))
trainer.fit(module)                      # stops early; status FINISHED
```

Events, all of the module (Lightning 2.x): ``training_step`` is yours, so it is
woven on your class, and the loop stages Lightning runs for it are routed to it:

| event | what it is |
|---|---|
| ``fit`` | ``_FitLoop.run``: the fit, once the module is attached to the trainer |
| ``epoch`` | ``_TrainingEpochLoop.run``: one training epoch |
| ``step`` | ``_TrainingEpochLoop.advance``: one training batch (its optimizer step, and the validation run it triggers) |
| ``loss`` | ``training_step``: returns the loss (or the mapping holding it) |
| ``backward`` | ``backward(loss)``: automatic optimization calls it, and so does ``self.manual_backward(loss)`` in manual optimization |
| ``optimizer_step`` | ``optimizer_step``, once per real update: automatic optimization calls it only when ``accumulate_grad_batches`` batches are in (it runs the closure: ``training_step`` and ``backward``, so ``loss`` and ``backward`` fire inside it); in manual optimization (``automatic_optimization = False``) each ``opt.step()`` of an optimizer from ``self.optimizers()`` is routed through it, so the count is ``trainer.global_step`` either way |
| ``evaluate`` | ``_EvaluationLoop.run`` during ``fit`` (not the sanity check): returns ``trainer.callback_metrics`` (what ``self.log`` logged, ``val_loss``), which ``EarlyStopping`` and ``BestCheckpoint`` read. As Lightning's own ``EarlyStopping`` and ``ModelCheckpoint``, ``validate()``, ``test()`` and ``predict()`` called outside ``fit`` are no evaluations: they run with callbacks attached and fire none |
| ``log`` | each set of metrics Lightning logs (``_LoggerConnector.log_metrics``, what ``self.log`` logged, every ``log_every_n_steps`` and after each validation), as one row with its ``step`` (``_batches_that_stepped``) and ``epoch``, as Lightning's loggers get it, with or without a logger configured: ``MetricsLogger`` logs those rows |

Manual optimization: ``training_step`` returns its loss after ``manual_backward``
used it, so a callback on ``loss`` that returns another value would change nothing
the weights see: it is refused at that step, naming ``backward`` (whose ``loss``
argument is ``manual_backward``'s) as the event to scale or replace the loss on.

``hw.StopTraining`` raised by any callback during ``fit`` sets
``trainer.should_stop = True``, as Lightning's own ``EarlyStopping`` does: the
current stage finishes, the loops end at their next check (after ``min_epochs``),
and ``fit`` ends normally (``trainer.state.status`` is ``FINISHED``, not
``INTERRUPTED``; checkpoints and ``on_fit_end`` run). Callbacks that read
``model`` (``GradNorm``, ``BestCheckpoint``) get ``model=module``: the hooked object
is the module itself; ``LRMonitor(optimizer=...)`` takes the optimizer.
"""

from __future__ import annotations

import threading
from typing import Any

from ..extend import check_plain
from ..errors import HookError
from .. import callback_state
from . import needs_framework
from ._weaving import (PresetHandle, accumulates, counts_updates, done, instead, log_event, patch, resume_callbacks,
                       resume_without_state, resumes_itself, routed, scales_loss, stage, stop_while_running,
                       target_class)

__all__ = ["weave"]

# How to accumulate gradients here: GradAccumulation, which cannot, names it.
ACCUMULATION = "Trainer(accumulate_grad_batches=N), or in manual optimization step every N batches"
# How to resume a run here: Checkpoint's resume, which cannot, names it.
RESUME = ("trainer.fit(module, ckpt_path=...) from a checkpoint Lightning saved (ModelCheckpoint, "
          "OnExceptionCheckpoint): it restores hookwrap's callbacks too")


@needs_framework("lightning")
def weave(module: Any = None) -> PresetHandle:
    """Weave your ``LightningModule`` subclass (or the class of ``module``, an instance).
    Returns a handle whose ``remove()`` restores everything."""
    import lightning.pytorch as pl
    from lightning.pytorch.core.optimizer import LightningOptimizer
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector
    from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
    from lightning.pytorch.trainer.states import TrainerFn
    from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
    from lightning.pytorch.loops.fit_loop import _FitLoop
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    where = "hookwrap.integrations.lightning.weave()"
    if module is None:
        raise HookError(f"{where}: pass your LightningModule subclass, weave(MyModule): its training_step is "
                        f"your own, so the preset weaves your class (hookwrap run --preset cannot name it).")
    cls = target_class(module, pl.LightningModule, where, "your LightningModule subclass")
    if cls is pl.LightningModule:
        raise HookError(f"{where}: pass your LightningModule subclass (the one defining training_step), "
                        f"not LightningModule itself: a method your class overrides is not woven on its base.")
    handle = PresetHandle(f"lightning {cls.__qualname__}")

    def ask_to_stop(module: Any) -> None:  # as Lightning's EarlyStopping does
        module.trainer.should_stop = True

    stop = stop_while_running(ask_to_stop)

    def owner(loop: Any) -> Any:  # loop.trainer.lightning_module, without its two properties' calls
        try:
            return loop.trainer._accelerator_connector.strategy._lightning_module
        except AttributeError:  # another Lightning than the pinned one
            return loop.trainer.lightning_module

    def evaluated(loop: Any) -> Any:  # validation during fit only, as Lightning's EarlyStopping counts it
        trainer = loop.trainer
        return trainer.lightning_module if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking \
            else None

    def metrics(owner: Any, result: Any) -> dict[str, Any]:
        return dict(owner.trainer.callback_metrics)

    def loss_changed(module: Any, original: Any, result: Any) -> None:
        if module.automatic_optimization:
            return
        raise HookError(
            f"hookwrap.integrations.lightning: a callback on 'loss' returned another value than "
            f"{type(module).__qualname__}.training_step did, and the module uses manual optimization "
            f"(automatic_optimization = False): manual_backward has used the loss by then, so the change "
            f"would reach no weight. Change it on 'backward' instead (a before callback taking and "
            f"returning `loss`, the argument of self.manual_backward).")

    with handle.building():
        routed(handle, cls, "fit", _FitLoop, "run", owner, fit=True)
        routed(handle, cls, "epoch", _TrainingEpochLoop, "run", owner, stop=stop)
        routed(handle, cls, "step", _TrainingEpochLoop, "advance", owner, stop=stop)
        stage(handle, cls, "loss", "training_step", stop=stop, changed=loss_changed)
        stage(handle, cls, "backward", "backward", stop=stop)
        optimizer_step = stage(handle, cls, "optimizer_step", "optimizer_step", stop=stop, substitutable=True)
        accumulates(handle, cls, optimizer_step, ACCUMULATION)  # GradAccumulation refuses, naming it
        counts_updates(handle, cls, optimizer_step, ("step",), _global_step, "trainer.global_step")
        scales_loss(handle, cls, _scaler)  # precision="16-mixed"
        resumes_itself(handle, cls, RESUME)  # Checkpoint's resume refuses, naming it
        routed(handle, cls, "evaluate", _EvaluationLoop, "run", evaluated, returns=metrics, stop=stop)
        _route_manual_steps(handle, cls, LightningOptimizer, optimizer_step)
        _route_logs(handle, cls, _LoggerConnector, stop)
        _checkpoint_callbacks(handle, cls, _CheckpointConnector)
    return handle


def _global_step(module: Any) -> Any:
    """Lightning's count of optimizer updates done (``trainer.global_step``): the step
    ``ModelCheckpoint`` names its files with and the loggers log at."""
    trainer = getattr(module, "_trainer", None)
    return None if trainer is None else trainer.global_step


def _scaler(module: Any) -> Any:
    """The GradScaler of Lightning's ``16-mixed`` precision (``MixedPrecision.scaler``), or None."""
    trainer = getattr(module, "_trainer", None)
    return getattr(getattr(trainer, "precision_plugin", None), "scaler", None)


STATE_KEY = "hookwrap_callbacks"


def _checkpoint_callbacks(handle: PresetHandle, cls: type, connector_cls: type) -> None:
    """Each checkpoint Lightning writes (``ModelCheckpoint``, ``trainer.save_checkpoint``)
    holds the state of the hookwrap callbacks attached to the module (``STATE_KEY``),
    and ``trainer.fit(..., ckpt_path=...)`` gives it back to them where Lightning
    restores its own callbacks: a resumed run decides as one that never stopped."""

    def make_dump(original: Any, layer: Any) -> Any:
        def dump_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
            checkpoint = original(self, *args, **kwargs)
            module = self.trainer.lightning_module
            if not layer.removed and isinstance(module, cls):
                state = callback_state(module)  # on every rank: settling may be a collective
                if state:  # plain data: the checkpoint loads with weights_only=True
                    check_plain(state, "hookwrap.integrations.lightning", "hw.callback_state(module)")
                    checkpoint[STATE_KEY] = state
            return checkpoint
        return dump_checkpoint

    def make_restore(original: Any, layer: Any) -> Any:
        def restore_callbacks(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            module, loaded = self.trainer.lightning_module, self._loaded_checkpoint
            if not layer.removed and isinstance(module, cls) and loaded:
                path = getattr(self, "_ckpt_path", None)
                source = f"the checkpoint {path}" if path else "its checkpoint"
                if STATE_KEY in loaded:
                    resume_callbacks(module, loaded[STATE_KEY], source)
                else:
                    resume_without_state(module, source)
            return result
        return restore_callbacks

    patch(handle, connector_cls, "dump_checkpoint", make_dump)
    patch(handle, connector_cls, "restore_callbacks", make_restore)


def _route_logs(handle: PresetHandle, cls: Any, connector_cls: type, stop: Any) -> None:
    """Each ``log_metrics`` of the trainer's logger connector, the row Lightning gives
    its loggers (its step and epoch added as it adds them), goes through join point
    ``log``, even with no logger configured (where Lightning returns early)."""
    log_event(handle, cls, stop=stop)

    def make_log_metrics(original: Any, layer: Any) -> Any:
        def log_metrics(self: Any, metrics: Any, step: Any = None) -> Any:
            trainer = self.trainer
            module: Any = trainer.lightning_module
            if metrics and not layer.removed and isinstance(module, cls):
                row, at = dict(metrics), step
                if at is None:  # as log_metrics itself reads it
                    logged_step = row.pop("step", None)
                    if logged_step is not None:
                        at = int(logged_step)
                    else:
                        row.setdefault("epoch", trainer.current_epoch)
                        at = trainer.fit_loop.epoch_loop._batches_that_stepped
                module.hookwrap_log({**row, "step": at})
            return original(self, metrics, step)
        return log_metrics

    patch(handle, connector_cls, "log_metrics", make_log_metrics)
    handle.events["log"] = f"{connector_cls.__qualname__}.log_metrics"


def _route_manual_steps(handle: PresetHandle, cls: Any, optimizer_cls: type, optimizer_step: Any) -> None:
    """In manual optimization, ``opt.step()`` of a ``LightningOptimizer`` is an update
    Lightning counts (``global_step``) but never passes through the module's
    ``optimizer_step``: it is made that join point's call (its callbacks around it),
    the step itself in place of the method, which never runs (Lightning would not
    call it, and yours may do other things). What ``opt.step()`` returns (the
    closure's output) is what the event returns."""
    class Routing(threading.local):
        now = False  # an opt.step() is being routed (a stop may run the method plainly)

    local = Routing()
    import lightning.pytorch as pl

    automatic_property = vars(pl.LightningModule)["automatic_optimization"]

    def make_step(original: Any, layer: Any) -> Any:
        def step(self: Any, closure: Any = None, **kwargs: Any) -> Any:
            # Automatic optimization (every step of most runs) returns at the first
            # plain attribute reads: module._automatic_optimization, not the property.
            strategy = getattr(self, "_strategy", None)
            module = getattr(strategy, "_lightning_module", None)
            if not isinstance(module, cls) or local.now or layer.removed:
                return original(self, closure, **kwargs)
            automatic = module._automatic_optimization if type(module).automatic_optimization is automatic_property \
                else module.automatic_optimization  # a class of its own property
            if automatic or not module.trainer.training:
                return original(self, closure, **kwargs)
            trainer, local.now = module.trainer, True
            entry = instead(optimizer_step, lambda: original(self, closure, **kwargs))
            try:
                return module.optimizer_step(trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_idx, self,
                                             closure)
            finally:
                done(entry)
                local.now = False
        return step

    patch(handle, optimizer_cls, "step", make_step)
