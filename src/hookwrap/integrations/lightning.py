"""Lightning (``lightning.pytorch``), woven in one call on your ``LightningModule``::

    from hookwrap.integrations import lightning as hw_pl
    preset = hw_pl.weave(MyModule)           # the class you instantiate
    hw.add_callback(module, EarlyStopping("val_loss", patience=2))
    trainer.fit(module)                      # stops early; status FINISHED

Events, all of the module (Lightning 2.x): ``training_step`` is yours, so it is
woven on your class, and the loop stages Lightning runs for it are routed to it:

=================  =====================================================================
``fit``            ``_FitLoop.run``: the fit, once the module is attached to the trainer
``epoch``          ``_TrainingEpochLoop.run``: one training epoch
``step``           ``_TrainingEpochLoop.advance``: one training batch (its optimizer step,
                   and the validation run it triggers)
``loss``           ``training_step``: returns the loss (or the mapping holding it)
``backward``       ``backward(loss)``, as Lightning's automatic optimization calls it
``optimizer_step`` ``optimizer_step``: runs the closure (``training_step`` and ``backward``)
                   and steps the optimizer, so ``loss`` and ``backward`` fire inside it
``evaluate``       ``_EvaluationLoop.run`` during fit, validate and test (not the sanity
                   check): returns ``trainer.callback_metrics`` (what ``self.log`` logged,
                   ``val_loss``), which ``EarlyStopping`` and ``BestCheckpoint`` read
=================  =====================================================================

``hw.StopTraining`` raised by any callback during ``fit`` sets
``trainer.should_stop = True``, as Lightning's own ``EarlyStopping`` does: the
current stage finishes, the loops end at their next check (after ``min_epochs``),
and ``fit`` ends normally (``trainer.state.status`` is ``FINISHED``, not
``INTERRUPTED``; checkpoints and ``on_fit_end`` run). Callbacks that read
``model`` (``GradNorm``, ``BestCheckpoint``) get ``model=module``: the hooked object
is the module itself; ``LRMonitor(optimizer=...)`` takes the optimizer.
"""

from __future__ import annotations

from typing import Any

from ..errors import HookError
from ._weaving import PresetHandle, routed, stage, stop_while_running, target_class

__all__ = ["weave"]


def weave(module: Any = None) -> PresetHandle:
    """Weave your ``LightningModule`` subclass (or the class of ``module``, an instance).
    Returns a handle whose ``remove()`` restores everything."""
    import lightning.pytorch as pl
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

    def owner(loop: Any) -> Any:
        return loop.trainer.lightning_module

    def evaluated(loop: Any) -> Any:
        return None if loop.trainer.sanity_checking else loop.trainer.lightning_module

    def metrics(owner: Any, result: Any) -> dict[str, Any]:
        return dict(owner.trainer.callback_metrics)

    with handle.building():
        routed(handle, cls, "fit", _FitLoop, "run", owner, fit=True)
        routed(handle, cls, "epoch", _TrainingEpochLoop, "run", owner, stop=stop)
        routed(handle, cls, "step", _TrainingEpochLoop, "advance", owner, stop=stop)
        stage(handle, cls, "loss", "training_step", stop=stop)
        stage(handle, cls, "backward", "backward", stop=stop)
        stage(handle, cls, "optimizer_step", "optimizer_step", stop=stop)
        routed(handle, cls, "evaluate", _EvaluationLoop, "run", evaluated, returns=metrics, stop=stop)
    return handle
