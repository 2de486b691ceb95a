"""pytorch-accelerated's ``Trainer``, woven in one call:

```python
from hookwrap.integrations import pytorch_accelerated as hw_pa
preset = hw_pa.weave()                  # or weave(MyTrainer): your subclass
hw.add_callback(trainer, EarlyStopping("eval_loss_epoch", patience=2))
trainer.train(train_dataset=..., eval_dataset=..., num_epochs=...)  # stopped early
```

Events (pytorch-accelerated 0.1.x; ``Trainer`` methods unless said):

| event | what it is |
|---|---|
| ``fit`` | ``train`` |
| ``epoch`` | ``_run_train_epoch``: one pass over the train dataloader (the evaluation follows it) |
| ``step`` | ``_perform_forward_and_backward_passes``: forward, loss, backward of one batch |
| ``loss`` | ``calculate_train_batch_loss``, **only when the step calls it**: returns the ``loss`` of PA's mapping (a loss a callback returns instead goes back into it, before PA divides it by ``gradient_accumulation_steps``) |
| ``backward`` | ``backward_step(loss)``: the loss already divided by ``gradient_accumulation_steps`` |
| ``optimizer_step`` | ``optimizer_step``: the real update, once per ``gradient_accumulation_steps`` batches (and at an epoch's last batch) |
| ``evaluate`` | ``_run_eval_epoch``: one evaluation epoch; returns the latest value of every metric of ``trainer.run_history`` (``eval_loss_epoch``, ``train_loss_epoch``, what PA callbacks added), which ``EarlyStopping("eval_loss_epoch")`` and ``BestCheckpoint`` read (PA's method returns None, which PA still gets) |

``hw.StopTraining`` raised by any callback during ``train()`` stops the run as PA's
own ``EarlyStoppingCallback`` does: a ``StopTrainingError`` raised from PA's callback
handler, at the next check: before the next training batch, or once every PA
callback has seen the end of the epoch (``on_training_run_epoch_end``). The current
stage finishes, PA breaks its epoch loop, and ``train()`` ends normally
(``on_stop_training_error``, ``training_run_end``, ``on_training_run_end``:
``SaveBestModelCallback`` reloads the best model). Other errors propagate out of
``train()``.

A step is one optimizer update (PA's ``gradient_accumulation_steps``), counted by the
callbacks (PA keeps no count of its updates). ``trainer.save_checkpoint(...)`` saves
the state of the hookwrap callbacks attached to the trainer in the checkpoint file
(key ``STATE_KEY``), and ``trainer.load_checkpoint(...)`` outside a run gives it back
(inside a run, ``SaveBestModelCallback``'s reload of the best weights, the callbacks
keep theirs). ``save_training_state(dir)`` writes it to ``dir/STATE_FILE``, and
``train(resume_from=dir)`` restores it with PA's run position.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from .. import callback_state
from ..extend import check_plain
from . import needs_framework
from ._weaving import (PresetHandle, Stage, _set, accumulates, counts_updates, decides_as, patch, resume_callbacks,
                       resume_from_folder, resume_without_state, resumes_itself, routed, running, save_into_folder,
                       scales_loss, stage, stop_while_running, target_class)

__all__ = ["STATE_FILE", "STATE_KEY", "weave"]

# How to accumulate gradients here: GradAccumulation, which cannot, names it.
ACCUMULATION = "Trainer.train(gradient_accumulation_steps=N)"
# How to resume a run here: Checkpoint's resume, which cannot, names it.
RESUME = ("trainer.train(resume_from=...) from a folder trainer.save_training_state(...) wrote: "
          "it restores hookwrap's callbacks too")
STATE_KEY = "hookwrap_callbacks"  # in the file save_checkpoint writes
STATE_FILE = "hookwrap_callbacks.pt"  # in the folder save_training_state writes

_FLAG = "_hookwrap_stop_requested"  # on a trainer: a callback asked to stop its run
# The events of PA's callback handler after which a requested stop is raised, as a
# PA callback raises StopTrainingError: before a batch, and at the end of an epoch.
_CHECKS = frozenset({"on_train_step_start", "on_training_run_epoch_end"})


@needs_framework("pytorch_accelerated")
def weave(trainer: Any = None) -> PresetHandle:
    """Weave ``pytorch_accelerated.Trainer`` (or ``trainer``: a subclass, or an instance
    of one, whose class is woven). Returns a handle whose ``remove()`` restores everything."""
    import pytorch_accelerated
    from pytorch_accelerated.callbacks import CallbackHandler, StopTrainingError

    cls = target_class(trainer, pytorch_accelerated.Trainer, "hookwrap.integrations.pytorch_accelerated.weave()",
                       "a pytorch-accelerated Trainer class")
    handle = PresetHandle(f"pytorch_accelerated {cls.__qualname__}")

    def ask_to_stop(trainer: Any) -> None:  # raised at PA's callback handler's next check
        vars(trainer)[_FLAG] = True

    stop = stop_while_running(ask_to_stop)

    with handle.building():
        stage(handle, cls, "fit", "train", fit=True)
        stage(handle, cls, "epoch", "_run_train_epoch", stop=stop)
        step = stage(handle, cls, "step", "_perform_forward_and_backward_passes", stop=stop)
        _loss_event(handle, cls, stop, step)
        stage(handle, cls, "backward", "backward_step", stop=stop)
        optimizer_step = stage(handle, cls, "optimizer_step", "optimizer_step", stop=stop)
        accumulates(handle, cls, optimizer_step, ACCUMULATION)  # GradAccumulation refuses, naming it
        counts_updates(handle, cls, optimizer_step, ("step",), None, "optimizer updates")
        # EarlyStoppingCallback(early_stopping_threshold=...): a gain within it is no improvement.
        decides_as(handle, cls, small_gains_set_best=False)
        scales_loss(handle, cls, lambda trainer: getattr(trainer._accelerator, "scaler", None))
        resumes_itself(handle, cls, RESUME)  # Checkpoint's resume refuses, naming it
        routed(handle, cls, "evaluate", cls, "_run_eval_epoch", _itself, returns=_metrics, stop=stop)
        _stop_through_callback_handler(handle, cls, CallbackHandler, StopTrainingError)
        _checkpoint_callbacks(handle, cls)
    return handle


def _loss_event(handle: PresetHandle, cls: type, stop: Any, step: Stage) -> None:
    """Join point ``loss`` (``cls.hookwrap_loss(batch)``) returns the loss tensor of the
    mapping ``calculate_train_batch_loss`` returns, so the shipped callbacks read a loss
    (MetricsLogger, NanGuard); a loss a callback replaced goes back into PA's mapping,
    which PA then divides by its accumulation steps and passes to ``backward_step``."""
    local = threading.local()

    def make(original: Any, layer: Any) -> Any:
        def hookwrap_loss(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(self, batch, *args, **kwargs)
            local.out = out
            return out["loss"] if isinstance(out, Mapping) and "loss" in out else out

        hookwrap_loss.__name__ = "hookwrap_loss"
        hookwrap_loss.__qualname__ = f"{cls.__qualname__}.hookwrap_loss"
        _set(handle, cls, "hookwrap_loss", hookwrap_loss)

        def calculate_train_batch_loss(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
            if layer.removed:
                return original(self, batch, *args, **kwargs)
            previous, local.out = getattr(local, "out", None), None
            try:
                loss = self.hookwrap_loss(batch, *args, **kwargs)
                out = local.out
            finally:
                local.out = previous
            if isinstance(out, Mapping) and "loss" in out and loss is not out["loss"]:
                out = {**out, "loss": loss}  # a callback's replacement, as PA goes on with it
            return out
        return calculate_train_batch_loss

    patch(handle, cls, "calculate_train_batch_loss", make)
    stage(handle, cls, "loss", "hookwrap_loss", stop=stop, within=step)
    handle.events["loss"] = f"{cls.__qualname__}.calculate_train_batch_loss"


def _itself(trainer: Any) -> Any:
    return trainer


def _metrics(trainer: Any, result: Any) -> dict[str, Any]:
    """What an evaluation epoch returns as a join point: the latest value of each metric
    PA's run history holds (``eval_loss_epoch``, as PA's own callbacks read it)."""
    history = trainer.run_history
    return {name: history.get_latest_metric(name) for name in history.get_metric_names()}


def _stop_through_callback_handler(handle: PresetHandle, cls: type, handler: type, error: type) -> None:
    """A stop asked of a trainer of ``cls`` is raised from PA's callback handler as
    ``StopTrainingError`` (``error``) after the callbacks of a check event have run:
    PA catches it in its epoch loop and ends the run its way. A run's start forgets a
    request that came too late for the previous run."""

    def make(original: Any, layer: Any) -> Any:
        def call_event(self: Any, event: Any, *args: Any, **kwargs: Any) -> Any:
            trainer = args[0] if args else None
            if layer.removed or not isinstance(trainer, cls):
                return original(self, event, *args, **kwargs)
            if event == "on_training_run_start":
                vars(trainer).pop(_FLAG, None)
            result = original(self, event, *args, **kwargs)
            if event in _CHECKS and vars(trainer).pop(_FLAG, False):
                raise error(f"hookwrap: {handle.stopped or 'a callback raised StopTraining'}")
            return result
        return call_event

    patch(handle, handler, "call_event", make)


def _checkpoint_callbacks(handle: PresetHandle, cls: type) -> None:
    """The state of the hookwrap callbacks attached to a trainer goes where PA saves:
    into the file ``save_checkpoint`` writes (under ``STATE_KEY``), read back by
    ``load_checkpoint`` (which PA reads with ``torch.load(weights_only=True)``), and
    into the folder ``save_training_state`` writes (``STATE_FILE``), read back by
    ``load_training_state`` (``train(resume_from=...)``). Plain data only: a checkpoint
    runs no code."""
    where = "hookwrap.integrations.pytorch_accelerated"

    def make_save(original: Any, layer: Any) -> Any:
        def save_checkpoint(self: Any, save_path: Any, checkpoint_kwargs: Any = None, *args: Any,
                            **kwargs: Any) -> Any:
            if not layer.removed:
                state = callback_state(self)
                if state:
                    check_plain(state, where, "hw.callback_state(trainer)")
                    checkpoint_kwargs = {**(checkpoint_kwargs or {}), STATE_KEY: state}
            return original(self, save_path, checkpoint_kwargs, *args, **kwargs)
        return save_checkpoint

    def make_load(original: Any, layer: Any) -> Any:
        def load_checkpoint(self: Any, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
            checkpoint = original(self, checkpoint_path, *args, **kwargs)
            # Inside a run (SaveBestModelCallback reloading the best weights at its end)
            # the callbacks keep their state: only the weights go back.
            if not layer.removed and not running(self):
                if isinstance(checkpoint, dict) and STATE_KEY in checkpoint:
                    resume_callbacks(self, checkpoint[STATE_KEY], str(checkpoint_path))
                else:
                    resume_without_state(self, str(checkpoint_path))
            return checkpoint
        return load_checkpoint

    def make_save_state(original: Any, layer: Any) -> Any:
        def save_training_state(self: Any, output_dir: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, output_dir, *args, **kwargs)
            if not layer.removed:
                save_into_folder(self, output_dir, STATE_FILE, where, self.run_config.is_world_process_zero)
            return result
        return save_training_state

    def make_load_state(original: Any, layer: Any) -> Any:
        def load_training_state(self: Any, input_dir: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, input_dir, *args, **kwargs)
            if not layer.removed:
                resume_from_folder(self, input_dir, STATE_FILE)
            return result
        return load_training_state

    patch(handle, cls, "save_checkpoint", make_save)
    patch(handle, cls, "load_checkpoint", make_load)
    patch(handle, cls, "save_training_state", make_save_state)
    patch(handle, cls, "load_training_state", make_load_state)
