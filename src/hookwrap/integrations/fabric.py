"""Lightning Fabric (``lightning.fabric.Fabric``): your own loop, with Fabric's calls
as join points of the fabric:

```python
from hookwrap.integrations import fabric as hw_fabric
preset = hw_fabric.weave()
fabric = Fabric(accelerator="cpu", callbacks=[EarlyStopping("val_loss")])  # attached
model, optimizer = fabric.setup(model, optimizer)
for epoch in range(epochs):
    for batch in loader:
        ...
        fabric.backward(loss)
        optimizer.step()
        fabric.call("on_train_batch_end", loss=loss)
    fabric.call("on_validation_end", val_loss=val_loss)
fabric.call("on_train_end")                  # the run's end: what callbacks held is settled
```

Events, of the fabric (Lightning 2.6):

| event | what it is |
|---|---|
| ``backward`` | ``fabric.backward(loss, ...)``: callbacks read ``loss`` (``NanGuard``, a loss-scaling ``before`` callback); ``GradNorm(model=...)`` after it |
| ``optimizer_step`` | ``step()`` of an optimizer ``fabric.setup``/``setup_optimizers`` returned (``_FabricOptimizer.step``, routed to the fabric that set it up): one per real update, as Fabric's own ``on_after_optimizer_step`` hook |
| ``step`` | ``fabric.call("on_train_batch_end", loss=...)``: a training batch ended (arguments ``loss``, ``values``: the call's keywords and the mappings passed positionally; returns ``loss``: ``loss=``, else ``outputs=``, a loss or a mapping holding ``"loss"``, as ``training_step`` returns) |
| ``loss`` | inside that ``step``, when it has a loss: returns it (``MetricsLogger`` logs it, ``NanGuard`` checks it); back-propagated already, so a callback replacing it is an error (scale the loss ``before`` ``backward``; ``GradAccumulation`` does not apply: accumulate as Fabric does, below) |
| ``evaluate`` | ``fabric.call("on_validation_end", val_loss=...)``: returns the call's keywords as a dict (argument ``metrics``), which ``EarlyStopping`` and ``BestCheckpoint`` read |

Every other hook of ``fabric.call`` (Lightning's callback hooks: ``on_train_epoch_end``,
``on_validation_batch_end``, ... and ``weave(hooks=...)``'s) is a custom event of the
fabric: ``hw.on(fabric, "on_train_epoch_end", fn)`` and a ``hw.Callback``'s method of
that name get the keywords they name (the mapped hooks above are emitted too, before
their join point). A name that is neither runs Fabric's own callbacks, as before.

``hw.Callback`` objects (``hookwrap.torch``'s included) in ``Fabric(callbacks=[...])``
are attached to that fabric (``hw.add_callback``) and taken out of the list Fabric
calls itself, so each runs once, through hookwrap; anything else in the list is
Fabric's, called as before. The hooked object is the fabric, which holds no model:
pass ``BestCheckpoint``, ``GradNorm`` and ``Checkpoint`` ``model=`` your model (the
module you set up, or what ``fabric.setup`` returned), ``LRMonitor`` the optimizer.

Gradient accumulation: Fabric steps when your loop calls ``optimizer.step()``;
``fabric.no_backward_sync(model, enabled=...)`` only skips the gradient all-reduce of
the batches in between. So with ``optimizer.step()`` every k batches,
``backward`` fires each batch and ``optimizer_step`` once per k: one per update.
(With ``precision="16-mixed"`` a step the gradient scaler skips for an inf still fires,
as Fabric's ``on_after_optimizer_step`` does.)

The run's end: a Fabric loop has no ``fit`` call. Deferring callbacks (``MetricsLogger``'s
rows, ``NanGuard``'s queued checks) settle when ``fabric.call("on_train_end")`` or
``("on_fit_end")`` runs (the run ended: loggers finalize), at the end of a ``with
hookwrap.extend.boundary():`` block around your loop (``hookwrap run`` runs the script in
one), and otherwise at the process's endings (SIGTERM, exit); between those they read
back at their own points (NanGuard every ``check_every`` checks), never once per step.

``hw.StopTraining`` (``EarlyStopping`` on ``evaluate``, any callback here): with
``stop="raise"`` (the default) it propagates out of the call that raised it into your
loop, as in any hookwrap loop. With ``stop="flag"`` the call completes and
``should_stop(fabric)`` turns True; it reduces the decision over every process (one
rank stopping stops all, as Lightning's ``EarlyStopping`` decides), so call it on every
rank at the same point of the loop:

```python
if hw_fabric.should_stop(fabric):
    break
```

State: ``fabric.save(path, state)`` adds ``hw.callback_state(fabric)`` under
``"hookwrap"`` (unless ``state`` has that key: yours), and ``fabric.load(path, state)``
gives it back to the callbacks attached (``hw.load_callback_state``), so a resumed run
decides as one that never stopped.
"""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

from .. import Callback, add_callback, callback_state, describe, emit, load_callback_state
from ..errors import HookError, HookwrapWarning, StopTraining
from ..extend import Defers, Ending, check_plain, stateful_callbacks
from . import needs_framework
from ._weaving import (PresetHandle, _raw, _set, accumulates, counts_updates, routed, scales_loss, stage,
                       target_class)

__all__ = ["CHECKPOINT_KEY", "HOOKS", "should_stop", "weave"]

# How to accumulate gradients here: GradAccumulation, which cannot, names it.
ACCUMULATION = "step the optimizer every N batches, under `with fabric.no_backward_sync(model, enabled=...)`"

CHECKPOINT_KEY = "hookwrap"
"""The key of ``fabric.save``'s checkpoint holding ``hw.callback_state(fabric)``."""

# Lightning's callback hooks (lightning.pytorch.Callback, 2.6) and Fabric's own, the names
# Fabric users pass to fabric.call: custom events of the fabric.
HOOKS: tuple[str, ...] = (
    "on_after_setup", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end",
    "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start", "on_train_batch_end",
    "on_validation_start", "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_validation_model_eval",
    "on_validation_model_train", "on_test_start", "on_test_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_test_batch_start", "on_test_batch_end", "on_test_model_eval", "on_test_model_train",
    "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
    "on_save_checkpoint", "on_load_checkpoint", "on_exception",
)
_STEP, _EVALUATE, _RUN_END = "on_train_batch_end", "on_validation_end", ("on_train_end", "on_fit_end")

_stopped: weakref.WeakKeyDictionary[Any, StopTraining] = weakref.WeakKeyDictionary()


def should_stop(fabric: Any) -> bool:
    """Whether a callback raised ``hw.StopTraining`` on ``fabric`` (``stop="flag"``), on
    any process: a collective (``strategy.reduce_boolean_decision``), so call it on every
    rank at the same point of the loop, and every rank gets the same answer."""
    return bool(fabric.strategy.reduce_boolean_decision(fabric in _stopped, all=False))


def _metrics(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The values of a ``fabric.call``: its keywords, and a mapping passed positionally."""
    values: dict[str, Any] = {}
    for arg in args:
        if isinstance(arg, Mapping):
            values.update(arg)
    values.update(kwargs)
    return values


def _loss(values: dict[str, Any]) -> Any:
    """The loss of a training batch's hook: ``loss=``, else ``outputs=`` (a loss, or a
    mapping holding one, as Lightning's ``training_step`` returns; also when passed
    positionally, as Fabric's example trainer does)."""
    if values.get("loss") is not None:
        return values["loss"]
    outputs = values.get("outputs")
    return outputs.get("loss") if isinstance(outputs, Mapping) else outputs


@needs_framework("fabric")
def weave(fabric: Any = None, *, stop: str = "raise", hooks: tuple[str, ...] = ()) -> PresetHandle:
    """Weave ``lightning.fabric.Fabric`` (or ``fabric``: a subclass, or an instance of one).
    ``stop``: ``"raise"`` or ``"flag"`` (see the module). ``hooks``: more ``fabric.call``
    names to make custom events of the fabric. Returns a handle whose ``remove()``
    restores everything."""
    from lightning.fabric import Fabric
    from lightning.fabric.wrappers import _FabricOptimizer

    where = "hookwrap.integrations.fabric.weave()"
    if stop not in ("raise", "flag"):
        raise HookError(f"{where}: stop must be 'raise' (StopTraining propagates to your loop) or "
                        f"'flag' (the call completes; check hookwrap.integrations.fabric.should_stop(fabric)), "
                        f"got {stop!r}.")
    if isinstance(hooks, str) or not all(isinstance(h, str) and h.isidentifier() for h in hooks):
        raise HookError(f"{where}: hooks must be a tuple of fabric.call hook names like ('on_my_hook',), "
                        f"got {hooks!r}.")
    cls = target_class(fabric, Fabric, where, "a lightning.fabric Fabric class")
    handle = PresetHandle(f"fabric {cls.__qualname__}")
    names = frozenset(HOOKS) | frozenset(hooks)
    owners: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # optimizer -> ref(fabric)

    def flag(owner: Any, exc: StopTraining) -> bool:
        _stopped[owner] = exc
        return True

    options: dict[str, Any] = {"stop": flag} if stop == "flag" else {}
    init, setup, setup_optimizers = (_raw(cls, name, where) for name in ("__init__", "setup", "setup_optimizers"))
    backward, call, save, load = (_raw(cls, name, where) for name in ("backward", "call", "save", "load"))

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        # hookwrap's callbacks run through hookwrap, once: Fabric would call their
        # on_* methods without the object, and never their pre_/post_ ones.
        ours = [cb for cb in self._callbacks if isinstance(cb, Callback)]
        if ours:
            self._callbacks = [cb for cb in self._callbacks if not isinstance(cb, Callback)]
            for cb in ours:
                try:
                    add_callback(self, cb)
                except HookError as exc:  # said as the Fabric(callbacks=...) it came from
                    raise type(exc)(
                        f"Fabric(callbacks=[...]): hookwrap.integrations.fabric attaches {type(cb).__name__} "
                        f"to the fabric, and it does not fit: {exc} The fabric's events: backward, "
                        f"optimizer_step, step, loss, evaluate, and fabric.call's hooks (a name of your own: "
                        f"weave(hooks=('on_my_hook',)))."
                    ) from None

    def owned(self: Any, result: Any) -> Any:
        for item in result if isinstance(result, tuple) else (result,):
            if isinstance(item, _FabricOptimizer):
                owners[item] = weakref.ref(self)
        return result

    @functools.wraps(setup)
    def setup_(self: Any, *args: Any, **kwargs: Any) -> Any:
        return owned(self, setup(self, *args, **kwargs))

    @functools.wraps(setup_optimizers)
    def setup_optimizers_(self: Any, *optimizers: Any) -> Any:
        return owned(self, setup_optimizers(self, *optimizers))

    def optimizer_owner(optimizer: Any) -> Any:
        ref = owners.get(optimizer)
        return None if ref is None else ref()

    def hookwrap_backward(self: Any, loss: Any, *args: Any, **kwargs: Any) -> None:
        """``fabric.backward(loss, ...)`` (join point ``backward``)."""
        return backward(self, loss, *args, **kwargs)  # type: ignore[no-any-return]

    @functools.wraps(backward)
    def backward_(self: Any, tensor: Any, *args: Any, **kwargs: Any) -> None:
        return self.hookwrap_backward(tensor, *args, **kwargs)  # type: ignore[no-any-return]

    def hookwrap_step(self: Any, loss: Any, values: dict[str, Any]) -> Any:
        """``fabric.call("on_train_batch_end", loss=...)`` (join point ``step``): returns ``loss``."""
        if loss is not None and self.hookwrap_loss(loss) is not loss:
            # Back-propagated already: a replacement (a scaled loss) would change nothing.
            raise HookError(
                f"hookwrap.integrations.fabric: a callback of 'loss' replaced the loss of "
                f"fabric.call({_STEP!r}), which fabric.backward has back-propagated already, so it would "
                f"change nothing. Change the loss before it is back-propagated: "
                f"hw.before(fabric, 'backward', fn) with fn(self, loss) returning the new loss (for "
                f"gradient accumulation, fabric.no_backward_sync and optimizer.step() every k batches).")
        return loss

    def hookwrap_loss(self: Any, loss: Any) -> Any:
        """The ``loss`` of ``fabric.call("on_train_batch_end", loss=...)`` (join point ``loss``)."""
        return loss

    def hookwrap_evaluate(self: Any, metrics: dict[str, Any]) -> dict[str, Any]:
        """``fabric.call("on_validation_end", **metrics)`` (join point ``evaluate``): the metrics."""
        return metrics

    @functools.wraps(call)
    def call_(self: Any, hook_name: str, *args: Any, **kwargs: Any) -> None:
        call(self, hook_name, *args, **kwargs)  # Fabric's own callbacks, as before
        if hook_name not in names:
            return
        try:
            emit(self, hook_name, **kwargs)  # its custom event's listeners
        except StopTraining as exc:
            if stop != "flag":
                raise
            _stopped[self] = handle.stopped = exc
        if hook_name == _STEP:
            values = _metrics(args, kwargs)
            self.hookwrap_step(_loss(values), values)
        elif hook_name == _EVALUATE:
            self.hookwrap_evaluate(_metrics(args, kwargs))
        elif hook_name in _RUN_END:
            _settle(self, Ending("fit"))

    @functools.wraps(save)
    def save_(self: Any, path: Any, state: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(state, dict) and CHECKPOINT_KEY not in state and stateful_callbacks(self):
            saved = callback_state(self)  # plain data: the file loads with weights_only=True
            check_plain(saved, "hookwrap.integrations.fabric", "hw.callback_state(fabric)")
            state = {**state, CHECKPOINT_KEY: saved}
        save(self, path, state, *args, **kwargs)

    @functools.wraps(load)
    def load_(self: Any, path: Any, state: Any = None, *args: Any, **kwargs: Any) -> Any:
        remainder = load(self, path, state, *args, **kwargs)
        if not state or CHECKPOINT_KEY in state:  # the whole checkpoint asked for, or the key is yours
            return remainder
        saved = remainder.pop(CHECKPOINT_KEY, None)
        if saved is not None:
            strict = kwargs.get("strict", args[0] if args else True)
            load_callback_state(self, saved, strict=strict)
        elif stateful_callbacks(self):
            warnings.warn(f"hookwrap.integrations.fabric: {path} holds no {CHECKPOINT_KEY!r} state, so the "
                          f"callbacks attached to the fabric ({', '.join(stateful_callbacks(self))}) start "
                          f"afresh. It was saved without them (or before this preset was woven).",
                          HookwrapWarning, stacklevel=2)
        return remainder

    methods = {"hookwrap_backward": hookwrap_backward, "hookwrap_step": hookwrap_step,
               "hookwrap_loss": hookwrap_loss, "hookwrap_evaluate": hookwrap_evaluate}
    for name, method in methods.items():
        method.__qualname__ = f"{cls.__qualname__}.{name}"
    hookwrap_backward.__signature__ = inspect.signature(hookwrap_backward)  # type: ignore[attr-defined]

    with handle.building():
        _set(handle, cls, "emits", tuple(sorted(names)))  # fabric.call's hooks: custom events of the fabric
        for name, method in methods.items():
            _set(handle, cls, name, method)
        _set(handle, cls, "__init__", __init__)
        _set(handle, cls, "setup", setup_)
        _set(handle, cls, "setup_optimizers", setup_optimizers_)
        _set(handle, cls, "backward", backward_)
        _set(handle, cls, "call", call_)
        _set(handle, cls, "save", save_)
        _set(handle, cls, "load", load_)
        stage(handle, cls, "backward", "hookwrap_backward", **options)
        optimizer_step = routed(handle, cls, "optimizer_step", _FabricOptimizer, "step", optimizer_owner, **options)
        accumulates(handle, cls, optimizer_step, ACCUMULATION)  # GradAccumulation refuses, naming it
        # A batch begins with its backward (the step event is said at its end); Fabric keeps no count.
        counts_updates(handle, cls, optimizer_step, ("backward",), None, "optimizer.step() calls Fabric runs")
        scales_loss(handle, cls, lambda fabric: getattr(fabric._precision, "scaler", None))  # precision="16-mixed"
        stage(handle, cls, "step", "hookwrap_step", **options)
        stage(handle, cls, "loss", "hookwrap_loss", **options)
        stage(handle, cls, "evaluate", "hookwrap_evaluate", **options)
    handle.events.update({"backward": f"{cls.__qualname__}.backward",
                          "step": f"{cls.__qualname__}.call('{_STEP}')",
                          "loss": f"{cls.__qualname__}.call('{_STEP}', loss=...)",
                          "evaluate": f"{cls.__qualname__}.call('{_EVALUATE}')"})
    return handle


def _settle(fabric: Any, ending: Ending) -> None:
    """The run ended (``on_train_end``): deliver what the fabric's deferring callbacks hold."""
    for cb in describe(fabric).callback_objects():
        if isinstance(cb, Defers):
            cb.settle(fabric, ending)
