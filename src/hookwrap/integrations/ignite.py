"""PyTorch-Ignite ``Engine``, woven in one call:

```python
from hookwrap.integrations import ignite as hw_ignite
preset = hw_ignite.weave()              # or weave(MyEngine)
hw.add_callback(trainer, NanGuard(events="step"))
trainer.run(loader, max_epochs=5)
```

Events, all of the engine (pytorch-ignite 0.5):

| event | what it is |
|---|---|
| ``fit`` | ``Engine.run`` (returns its ``State``) |
| ``epoch`` | one epoch (``_run_once_on_dataset_as_gen``, driven through the join point; an ``interrupt()`` ends the epoch event where it interrupts, and the rest of the epoch runs when ``run`` resumes, without callbacks) |
| ``step`` | the engine's update function: ignite stores it on the instance (``engine._process_function``, called ``(engine, batch)``); a property of the class routes each call through join point ``step`` (arguments ``batch``; returns the output, the loss of ``create_supervised_trainer``), with no adapter to write |
| ``evaluate`` | ``run`` of another engine (an evaluator) called while this one runs (from its handler): an event of the *running* engine that returns the evaluator's ``state.metrics``, which ``EarlyStopping`` and ``BestCheckpoint`` attached to the trainer read |

With ``Engine.interrupt_resume_enabled = False`` (ignite's legacy loop) there is no
``epoch`` event: that loop runs ``_run_once_on_dataset_legacy``, which is not woven.

``hw.StopTraining`` raised by any callback during ``run`` calls ``engine.terminate()``,
as ignite's own ``EarlyStopping`` handler does: the current iteration finishes, then
the engine fires ``TERMINATE`` and ``COMPLETED`` and ``run`` returns its state.
(``loss``, ``backward`` and ``optimizer_step`` live inside your update function:
make them hookable there with ``@hw.hookable``.)
"""

from __future__ import annotations

import weakref
from typing import Any

from . import needs_framework
from ._weaving import (PresetHandle, _raw, _set, current_run, decides_as, resumes_itself, routed, stage,
                       stop_while_running, target_class)

__all__ = ["weave"]

# How to resume a run here: Checkpoint's resume, which cannot, names it.
RESUME = ("ignite's Checkpoint(to_save={..., 'trainer': trainer, 'hookwrap': hw.CallbackState(trainer)}) and "
          "Checkpoint.load_objects(to_load=..., checkpoint=...): the trainer's state is its position, "
          "hookwrap's callbacks go with it")


class _Ended:
    """The epoch join point's body ended by an interrupt (``gen``, what it yielded) or by
    ignite's terminate exception (``error``): the caller's generator goes on from there."""

    def __init__(self, gen: Any = None, value: Any = None, error: BaseException | None = None) -> None:
        self.gen, self.value, self.error = gen, value, error


@needs_framework("ignite")
def weave(engine: Any = None) -> PresetHandle:
    """Weave ``ignite.engine.Engine`` (or ``engine``: a subclass, or an instance of one).
    Returns a handle whose ``remove()`` restores everything."""
    from ignite.engine import Engine
    from ignite.engine.engine import _EngineTerminateException

    where = "hookwrap.integrations.ignite.weave()"
    cls = target_class(engine, Engine, where, "an ignite Engine class")
    handle = PresetHandle(f"ignite {cls.__qualname__}")
    resumes_itself(handle, cls, RESUME)  # Checkpoint's resume refuses, naming it
    # ignite's EarlyStopping(cumulative_delta=False), its default: a gain within the threshold is the best.
    decides_as(handle, cls, small_gains_set_best=True)

    stop = stop_while_running(lambda engine: engine.terminate())

    run_epoch = _raw(cls, "_run_once_on_dataset_as_gen", where)

    def hookwrap_epoch(self: Any) -> Any:
        """One epoch of the engine (join point ``epoch``)."""
        gen = run_epoch(self)
        try:
            value = next(gen)
        except StopIteration as done:
            return done.value  # the epoch's time, as ignite returns it
        except _EngineTerminateException as exc:
            return _Ended(error=exc)
        return _Ended(gen=gen, value=value)

    def _run_once_on_dataset_as_gen(self: Any) -> Any:
        ended = self.hookwrap_epoch()
        if not isinstance(ended, _Ended):
            return ended
        if ended.error is not None:
            raise ended.error
        yield ended.value
        return (yield from ended.gen)

    made: weakref.WeakSet[Any] = weakref.WeakSet()  # engines whose update function the property stored

    def hookwrap_step(self: Any, batch: Any) -> Any:
        """The engine's update function (join point ``step``)."""
        try:
            update = self._hookwrap_update
        except AttributeError:  # an engine made before the preset
            update = vars(self)["_process_function"]
        return update(self, batch)

    def set_update(self: Any, update: Any) -> None:
        # An attribute of its own, not the instance dict's _process_function past
        # the property: reading vars(self) would make CPython drop the engine's
        # fast attribute access for every self.<name> of ignite's loop.
        self._hookwrap_update = update
        made.add(self)

    def give_back_updates() -> None:  # at remove(): engines made meanwhile keep their function
        for engine in list(made):
            vars(engine)["_process_function"] = engine.__dict__.pop("_hookwrap_update")

    def evaluator_owner(engine: Any) -> Any:
        run = current_run(cls)
        return run if run is not engine else None

    def metrics(owner: Any, state: Any) -> dict[str, Any]:
        return dict(state.metrics)

    with handle.building():
        stage(handle, cls, "fit", "run", fit=True)
        routed(handle, cls, "evaluate", cls, "run", evaluator_owner, returns=metrics, stop=stop)
        _set(handle, cls, "hookwrap_epoch", hookwrap_epoch)
        stage(handle, cls, "epoch", "hookwrap_epoch", stop=stop)
        _set(handle, cls, "_run_once_on_dataset_as_gen", _run_once_on_dataset_as_gen)
        _set(handle, cls, "hookwrap_step", hookwrap_step)
        stage(handle, cls, "step", "hookwrap_step", stop=stop)
        step = vars(cls)["hookwrap_step"]
        handle._undo.append(give_back_updates)
        _set(handle, cls, "_process_function", property(
            lambda self: step, set_update,
            doc="The update function, called through join point 'step' (hookwrap.integrations.ignite)."))
    handle.events["epoch"] = f"{cls.__qualname__}._run_once_on_dataset_as_gen"
    handle.events["step"] = f"{cls.__qualname__}._process_function"
    return handle
