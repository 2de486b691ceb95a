"""Hugging Face ``transformers.Trainer``, woven in one call:

```python
from hookwrap.integrations import transformers as hw_hf
preset = hw_hf.weave()                  # or weave(MyTrainer): your subclass
hw.add_callback(trainer, EarlyStopping("eval_loss", patience=2))
trainer.train()                         # returns its TrainOutput, stopped early
```

Events (transformers 5.x; ``Trainer`` methods unless said):

| event | what it is |
|---|---|
| ``fit`` | ``train`` (returns ``TrainOutput``) |
| ``epoch`` | ``_run_epoch``: one pass over the train dataloader |
| ``step`` | ``training_step``: forward, loss, backward of one batch (returns the loss) |
| ``loss`` | ``compute_loss``, **only when ``training_step`` calls it**: ``evaluate()`` reuses it in ``prediction_step``, where callbacks do not fire, so a loss-scaling callback never changes ``eval_loss`` |
| ``backward`` | ``Accelerator.backward(loss)`` called during this trainer's run, as an event of the trainer (NanGuard and GradNorm read ``loss``, ``trainer.model``) |
| ``optimizer_step`` | ``self.optimizer.step()`` (``AcceleratedOptimizer.step``) during the run; on DeepSpeed accelerate's no-op ``DeepSpeedOptimizerWrapper.step``, once per update (DeepSpeed ran it inside ``backward``), where ``GradNorm`` reports DeepSpeed's norm, HF's ``grad_norm`` |
| ``evaluate`` | ``evaluate``: returns the metrics mapping (``eval_loss``, ...), which ``EarlyStopping("eval_loss")`` and ``BestCheckpoint`` read |
| ``log`` | each row the trainer logs (``Trainer.log``): the row as ``state.log_history`` has it, ``step`` being ``global_step``. With it ``MetricsLogger`` logs what HF logs, where HF logs it: under gradient accumulation the optimizer step's loss (its micro-batches' shares added), every ``logging_steps`` updates, and the evaluations' metrics |

``hw.StopTraining`` raised by any callback during ``train()`` (EarlyStopping on
``evaluate``, a callback on ``step``) sets ``trainer.control.should_training_stop``,
as a ``TrainerCallback`` does: the current stage finishes, the loop breaks at its next
check, and ``train()`` ends normally (``on_train_end``, best-model loading, its
``TrainOutput``). Other errors (NanGuard's ``NonFiniteError``) propagate out of
``train()``. Callbacks attach to the trainer (``hw.add_callback(trainer, cb)``) or to
the class; ``BestCheckpoint`` and ``GradNorm`` read ``trainer.model``, ``LRMonitor``
``trainer.optimizer``.
"""

from __future__ import annotations

import os
from typing import Any

from . import needs_framework
from ._weaving import (PresetHandle, accumulates, counts_updates, current_run, decides_as, holds_gradients,
                       log_event, patch, resume_from_folder, resumes_itself, routed, save_into_folder, scales_loss,
                       stage, stop_while_running, target_class)

__all__ = ["weave"]

# How to accumulate gradients here: GradAccumulation, which cannot, names it.
ACCUMULATION = "TrainingArguments(gradient_accumulation_steps=N)"
# How to resume a run here: Checkpoint's resume, which cannot, names it.
RESUME = ("trainer.train(resume_from_checkpoint=...) from a checkpoint the Trainer saved "
          "(TrainingArguments(save_strategy=...)): it restores hookwrap's callbacks too")


@needs_framework("transformers", "accelerate")
def weave(trainer: Any = None) -> PresetHandle:
    """Weave ``transformers.Trainer`` (or ``trainer``: a subclass, or an instance of one,
    whose class is woven). Returns a handle whose ``remove()`` restores everything."""
    import transformers
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.utils.deepspeed import DeepSpeedOptimizerWrapper

    cls = target_class(trainer, transformers.Trainer, "hookwrap.integrations.transformers.weave()",
                       "a transformers Trainer class")
    handle = PresetHandle(f"transformers {cls.__qualname__}")

    def ask_to_stop(trainer: Any) -> None:  # as a TrainerCallback does
        trainer.control.should_training_stop = True

    stop = stop_while_running(ask_to_stop)

    def accelerator_owner(accelerator: Any) -> Any:
        run = current_run(cls)
        return run if run is not None and getattr(run, "accelerator", None) is accelerator else None

    def optimizer_owner(optimizer: Any) -> Any:
        run = current_run(cls)
        return run if run is not None and getattr(run, "optimizer", None) is optimizer else None

    with handle.building():
        stage(handle, cls, "fit", "train", fit=True)
        stage(handle, cls, "epoch", "_run_epoch", stop=stop)
        step = stage(handle, cls, "step", "training_step", stop=stop)
        stage(handle, cls, "loss", "compute_loss", stop=stop, within=step)
        routed(handle, cls, "backward", Accelerator, "backward", accelerator_owner, stop=stop)
        # On DeepSpeed the update runs inside backward (engine.step at the accumulation
        # boundary) and the Trainer's optimizer.step() is DeepSpeedOptimizerWrapper's no-op,
        # called once per update as on_optimizer_step is: the same event.
        optimizer_step = routed(handle, cls, "optimizer_step", AcceleratedOptimizer, "step", optimizer_owner,
                                also=(DeepSpeedOptimizerWrapper,), stop=stop)
        accumulates(handle, cls, optimizer_step, ACCUMULATION)  # GradAccumulation refuses, naming it
        counts_updates(handle, cls, optimizer_step, ("step",), _global_step, "state.global_step")
        # EarlyStoppingCallback(early_stopping_threshold=...): a gain within it still becomes HF's best.
        decides_as(handle, cls, small_gains_set_best=True)
        scales_loss(handle, cls, lambda trainer: getattr(trainer.accelerator, "scaler", None))  # fp16=True
        holds_gradients(handle, cls, _deepspeed_grad_norm)  # ZeRO: HF logs DeepSpeed's norm
        resumes_itself(handle, cls, RESUME)  # Checkpoint's resume refuses, naming it
        stage(handle, cls, "evaluate", "evaluate", stop=stop)
        _route_logs(handle, cls, stop)
        _checkpoint_callbacks(handle, cls)
    return handle


def _deepspeed_grad_norm(trainer: Any) -> Any:
    """On DeepSpeed, the engine's norm of its latest update's gradients (HF's
    ``grad_norm`` there: ``model.get_global_grad_norm()``); else None."""
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return None
    return getattr(trainer.model_wrapped, "get_global_grad_norm", None)


def _global_step(trainer: Any) -> Any:
    """HF's count of optimizer updates done: the step it logs, saves and evaluates at."""
    return trainer.state.global_step


STATE_FILE = "hookwrap_callbacks.pt"


def _checkpoint_callbacks(handle: PresetHandle, cls: type) -> None:
    """Each checkpoint the trainer saves (``checkpoint-<global_step>/``) holds the state of
    the hookwrap callbacks attached to it (``STATE_FILE``), and ``train(resume_from_checkpoint=...)``
    gives it back to them, as HF restores its own stateful callbacks: a resumed run
    decides as one that never stopped. The file is plain data, read with
    ``torch.load(weights_only=True)``: a checkpoint folder runs no code."""

    def make_save(original: Any, layer: Any) -> Any:
        def _save_checkpoint(self: Any, model: Any, trial: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, model, trial, *args, **kwargs)
            if not layer.removed:
                folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
                save_into_folder(self, folder, STATE_FILE, f"hookwrap.integrations.transformers: "
                                 f"{type(self).__qualname__}._save_checkpoint", self.args.should_save)
            return result
        return _save_checkpoint

    def make_prepare(original: Any, layer: Any) -> Any:
        def _prepare_for_training(self: Any, max_steps: Any, train_dataloader: Any, resume_from_checkpoint: Any,
                                  *args: Any, **kwargs: Any) -> Any:
            result = original(self, max_steps, train_dataloader, resume_from_checkpoint, *args, **kwargs)
            if not layer.removed and resume_from_checkpoint is not None:
                resume_from_folder(self, resume_from_checkpoint, STATE_FILE)
            return result
        return _prepare_for_training

    patch(handle, cls, "_save_checkpoint", make_save)
    patch(handle, cls, "_prepare_for_training", make_prepare)


def _route_logs(handle: PresetHandle, cls: type, stop: Any) -> None:
    """Each row ``Trainer.log`` appends to ``state.log_history`` goes through join point ``log``."""
    log_event(handle, cls, stop=stop)

    def make_log(original: Any, layer: Any) -> Any:
        def log(self: Any, *args: Any, **kwargs: Any) -> Any:
            history = self.state.log_history
            logged = len(history)
            result = original(self, *args, **kwargs)
            if not layer.removed and len(history) > logged:
                self.hookwrap_log(dict(history[-1]))
            return result
        return log

    patch(handle, cls, "log", make_log)
    handle.events["log"] = f"{cls.__qualname__}.log"
