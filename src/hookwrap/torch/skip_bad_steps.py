"""``SkipBadSteps``: the update of a step whose loss or gradients went bad is skipped,
and the run goes on."""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Any, Callable

import torch

from ..errors import HookError, SettingError, StopTraining
from ..extend import JoinPointInfo
from ._attach import CountingCallback, DefaultEvent, On, from_object, loss_reader, whole_number
from .grad_scaler import scale_of_gradients
from .logs_into import LogsInto, checked_logger, logged_name
from .monitors import total_norm

__all__ = ["Rollback", "SkipBadSteps"]

log = logging.getLogger(__name__)  # under "hookwrap": each skipped update, at WARNING

# The arguments a framework passes its optimizer step's closure under (Lightning's
# optimizer_step(..., optimizer_closure)): the step's forward and backward run in it.
_CLOSURES = ("optimizer_closure", "closure")


class SkipBadSteps(LogsInto, CountingCallback):
    """Around each call of ``event`` (default ``"optimizer_step"``), the update is
    skipped when the step went bad: a loss of the step (what ``loss_event`` returned,
    or its argument ``argument``; every micro-batch's since the last update) is NaN
    or infinite, the norm of the gradients the optimizer holds is (``check_grad_norm``),
    or, with ``spike_rtol``/``spike_atol``, the step's mean loss is worse than the
    mean of the last ``window`` good steps (``mode="min"``: higher) by at least that
    much (relative to the mean; absolute). The first ``warmup`` good steps are never
    spikes. A skipped update does not run (the optimizer's state, its step count and
    the weights stay as they were; on HF's ``Trainer`` its LR scheduler does not step
    for it either, as for a ``GradScaler``'s skip: accelerate's optimizer says so), its gradients are zeroed (``set_to_none``) so the
    next step starts clean, and the run goes on: a WARNING record under ``hookwrap``,
    a row ``name`` (the count of skips so far) into ``logger`` (or, under ``hookwrap
    run``, the run's MetricsLogger), and ``skipped`` lists ``(step, why)``. After
    ``max_consecutive`` skipped updates in a row the data or the run is broken, not
    one batch: ``StopTraining`` naming the steps (``max_consecutive=None``: never).

    The decision gates the update, so it is read on the host at each update: one
    read of a few numbers a step (on CUDA, a sync), not deferred as ``GradNorm``'s.
    ``optimizer``: the optimizer whose gradients are checked and zeroed (the join
    point's argument of that name, else the hooked object's attribute, else the
    object itself: attached to an optimizer, its ``step`` the event). Gradients a
    ``GradScaler`` (or a framework's fp16) scaled are its to judge: an overflow
    lowers its scale and skips that step itself, so the norm is not checked while
    they are scaled. On a framework whose optimizer step runs the step's forward and
    backward in a closure (Lightning), the closure runs first and is then judged.
    With ``GradAccumulation``, attach ``SkipBadSteps`` after it: it then sees the
    updates only, each judged on all its micro-batches."""

    def __init__(self, *, event: str = "optimizer_step", loss_event: str | None = "loss", argument: str = "loss",
                 optimizer: Any = "optimizer", check_grad_norm: bool = True, spike_rtol: float | None = None,
                 spike_atol: float | None = None, mode: str = "min", window: int = 10, warmup: int = 1,
                 max_consecutive: int | None = 5, logger: Any = None, name: str = "skipped_steps",
                 step_event: str | None = DefaultEvent("step")) -> None:
        super().__init__(step_event)
        where = type(self).__name__
        if not isinstance(event, str) or not event:
            raise SettingError(f"{where}: event must be the join point of the optimizer step, such as "
                               f"'optimizer_step', got {event!r}.")
        if loss_event is not None and (not isinstance(loss_event, str) or not loss_event):
            raise SettingError(f"{where}: loss_event must be a join point name such as 'loss', or None (gradients "
                               f"only), got {loss_event!r}.")
        if not isinstance(check_grad_norm, bool):
            raise SettingError(f"{where}: check_grad_norm must be True or False, got {check_grad_norm!r}.")
        if loss_event is None and not check_grad_norm:
            raise HookError(f"{where}: with loss_event=None and check_grad_norm=False nothing is checked. Name "
                            f"the loss's join point (loss_event='loss') or check the gradients.")
        for setting, value in (("spike_rtol", spike_rtol), ("spike_atol", spike_atol)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise SettingError(f"{where}: {setting} must be a finite number >= 0, or None (no such test), "
                                   f"got {value!r}.")
        if (spike_rtol is not None or spike_atol is not None) and loss_event is None:
            raise HookError(f"{where}: a spike is a loss against the mean of the last ones, and loss_event=None "
                            f"reads no loss. Name the loss's join point (loss_event='loss').")
        if mode not in ("min", "max"):
            raise SettingError(f"{where}: mode must be 'min' (a lower loss is better) or 'max', got {mode!r}.")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise SettingError(f"{where}: warmup must be a whole number >= 0, got {warmup!r}.")
        self.event, self.loss_event, self.argument = event, loss_event, argument
        self.optimizer, self.check_grad_norm = optimizer, check_grad_norm
        self.spike_rtol, self.spike_atol, self.mode, self.warmup = spike_rtol, spike_atol, mode, warmup
        self.window = whole_number(window, "window", where)
        self.max_consecutive = None if max_consecutive is None else \
            whole_number(max_consecutive, "max_consecutive", where)
        self.name = logged_name(name, where)
        self.logger = checked_logger(logger, where)
        self.skipped: list[tuple[int, str]] = []  # (step, why) of each skipped update
        self.consecutive = 0  # updates skipped in a row, up to the last one
        self._good: deque[float] = deque(maxlen=self.window)  # the mean losses of the last good steps
        self._losses: list[Any] = []  # this step's losses, as given (tensors stay on their device)
        self._said_skipped: Any = None  # the accelerate optimizer told the last update was skipped

    label = ("event",)
    keyed_by_label = True

    listens = (On("post", "loss_event", "record_loss", choose="_choose_loss", always=True),
               On("around", "event", "_guard", choose="_choose_guard", always=True))

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        declared = self.listens if self.loss_event is not None else self.listens[1:]
        return self.registrations(target, declared)

    # --- the losses of the step ----------------------------------------------------------

    def _choose_loss(self, jp: JoinPointInfo) -> Any:
        return loss_reader(self.where, jp, self.argument, self.record_loss,
                           "Pass loss_event= the join point that computes the loss, argument= the name of the "
                           "argument that carries it, or loss_event=None to check the gradients only.")

    def record_loss(self, obj: Any, loss: Any) -> None:
        """A loss of this step, kept as given until the update is judged."""
        if hasattr(loss, "detach"):
            if loss.numel() != 1:
                raise SettingError(f"{self.where}: the loss must be one number, got a tensor of shape "
                                   f"{tuple(loss.shape)} at step {self.step}. Check the join point returning the "
                                   f"reduced loss.")
            self._losses.append(loss.detach())
        elif isinstance(loss, (int, float)) and not isinstance(loss, bool):
            self._losses.append(float(loss))
        else:
            raise SettingError(f"{self.where}: the loss must be a tensor of one element or a number, got "
                               f"{type(loss).__name__} at step {self.step}.")

    # --- the update: judged, then run or skipped -----------------------------------------

    def _choose_guard(self, jp: JoinPointInfo) -> Callable[..., Any]:
        """The around advice on this join point: where it is given the step's closure
        (Lightning's ``optimizer_closure``), that closure runs before the step is judged."""
        closure = closure_position(jp)
        if jp.has_object:
            def guard_method(obj: Any, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
                optimizer = from_object(obj, self.optimizer, "optimizer", self.where)
                return self._guard(obj, optimizer, closure, proceed, args, kwargs)

            return guard_method

        def guard_function(proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            optimizer = from_object(None, self.optimizer, "optimizer", self.where)
            return self._guard(None, optimizer, closure, proceed, args, kwargs)

        return guard_function

    def _guard(self, obj: Any, optimizer: Any, closure: tuple[str, int] | None, proceed: Callable[..., Any],
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if closure is not None:
            args, kwargs = _closure_run_first(closure, args, kwargs)
        why = self._why_bad(obj, optimizer)
        said, self._said_skipped = self._said_skipped, None
        if said is not None and getattr(said, "_is_overflow", None) is True:
            said._is_overflow = False  # this update runs (a GradScaler's own step says it again)
        if why is None:
            self.consecutive = 0
            result = proceed(*args, **kwargs)
            self._made(obj, optimizer)
            return result
        self._skip(optimizer, why)
        self._undo(obj, optimizer, why)
        if getattr(optimizer, "_is_overflow", None) is False:
            # accelerate's optimizer (HF's Trainer): its "step skipped", as a GradScaler's overflow
            # sets it, so that the trainer does not step its LR scheduler for this update either.
            optimizer._is_overflow = True
            self._said_skipped = optimizer
        return None

    def _made(self, obj: Any, optimizer: Any) -> None:
        """A good update was made (Rollback keeps a copy here)."""

    def _undo(self, obj: Any, optimizer: Any, why: str) -> None:
        """A bad update was skipped (Rollback goes back here)."""

    def _why_bad(self, obj: Any, optimizer: Any) -> str | None:
        """Why this step's update must not run, or None: one read of the step's losses
        and its gradients' norm together."""
        losses, self._losses = self._losses, []
        numbers: list[Any] = []
        if losses:
            # float32: every device has it (MPS has no float64), and NaN, inf and a spike read the same.
            tensors = [torch.as_tensor(v, dtype=torch.float32) if not hasattr(v, "detach") else v for v in losses]
            device = tensors[0].device
            numbers.append(torch.stack([t.to(device=device, dtype=torch.float32).reshape(()) for t in tensors]))
        norm = None
        if self.check_grad_norm and scale_of_gradients(obj) is None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if grads:
                norm = total_norm(grads, 2.0).detach().to(torch.float32)
                numbers.append(norm.reshape(1).to(numbers[0].device) if numbers else norm.reshape(1))
        if not numbers:
            return None
        read = torch.cat(numbers).tolist()  # the one read of the step
        step_losses = read[:len(losses)]
        bad = [v for v in step_losses if not math.isfinite(v)]
        if bad:
            return f"a loss is {bad[0]}"
        if norm is not None and not math.isfinite(read[-1]):
            return f"the gradient norm is {read[-1]}"
        if not step_losses:
            return None
        mean = sum(step_losses) / len(step_losses)
        if self._is_spike(mean):
            return (f"its loss {mean:.6g} spiked against the mean {self.running_mean():.6g} of the last "
                    f"{len(self._good)} good steps")
        self._good.append(mean)
        return None

    def running_mean(self) -> float:
        return sum(self._good) / len(self._good) if self._good else math.nan

    def _is_spike(self, value: float) -> bool:
        if (self.spike_rtol is None and self.spike_atol is None) or len(self._good) < max(self.warmup, 1):
            return False
        mean = self.running_mean()
        worse = value - mean if self.mode == "min" else mean - value
        if worse <= 0:
            return False
        return (self.spike_atol is None or worse >= self.spike_atol) and \
            (self.spike_rtol is None or worse >= self.spike_rtol * abs(mean))

    def _skip(self, optimizer: Any, why: str) -> None:
        step = self.row_step()
        optimizer.zero_grad(set_to_none=True)
        self.skipped.append((step, why))
        self.consecutive += 1
        log.warning("%s: skipped the update of step %d: %s (%d skipped so far, %d in a row).", self.where, step,
                    why, len(self.skipped), self.consecutive)
        if self.logger is not None:
            self.logger.log(self.name, float(len(self.skipped)), step)
        if self.max_consecutive is not None and self.consecutive >= self.max_consecutive:
            steps = ", ".join(str(s) for s, _ in self.skipped[-self.consecutive:])
            raise StopTraining(
                f"{self.where}: {self.consecutive} updates in a row were skipped (steps {steps}; the last: {why}): "
                f"more than a bad batch. Lower the learning rate, check the data from step "
                f"{self.skipped[-self.consecutive][0]}, or resume from the last good checkpoint "
                f"(max_consecutive={self.max_consecutive}).")

    # --- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "skipped": [list(s) for s in self.skipped], "consecutive": self.consecutive,
                "good": list(self._good)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.skipped = [(int(step), str(why)) for step, why in state["skipped"]]
        self.consecutive = int(state["consecutive"])
        self._good = deque((float(v) for v in state["good"]), maxlen=self.window)


class Rollback(SkipBadSteps):
    """``SkipBadSteps``, and more: the update of a bad step is not made and the
    ``model`` and its optimizer go back to where they were after the last of every
    ``every`` good updates (a copy kept on ``device``, the CPU by default, taken after
    the 1st, the ``every+1``-th, ... good update), so what went wrong before the bad
    step was seen (a spike that was applied, weights drifting to NaN) is undone too;
    the run goes on with the next batch, past those that caused it. After
    ``max_rollbacks`` the run stops (``StopTraining``): the data or the settings are
    at fault, not a batch. Each rollback is a WARNING and a row ``name`` (the count so
    far) into ``logger``; ``rolled_back`` lists ``(step, back to step, why)``. The
    step counts of the run go on (a framework's global step is its own): only the
    weights and the optimizer's state go back, not its settings (the learning rate a
    scheduler set since the copy stays). The copy costs the memory of the model
    and its optimizer's state once, and a copy every ``every`` updates."""

    def __init__(self, *, every: int = 100, model: Any = "model", max_rollbacks: int = 3, device: Any = "cpu",
                 name: str = "rollbacks", **judged: Any) -> None:
        super().__init__(name=name, **judged)
        self.every = whole_number(every, "every", "Rollback")
        self.max_rollbacks = whole_number(max_rollbacks, "max_rollbacks", "Rollback")
        if not isinstance(model, (str, torch.nn.Module)):
            raise SettingError(f"Rollback: model must be the module, or the name of the argument or attribute that "
                               f"holds it, got {model!r}.")
        self.model, self.device = model, torch.device(device)
        self.rolled_back: list[tuple[int, int, str]] = []  # (step, back to the state after step, why)
        self._copy: tuple[int, dict[str, Any], Any] | None = None  # (after step, model state, optimizer state)
        self._made_since = 0  # good updates since the copy

    def _made(self, obj: Any, optimizer: Any) -> None:
        self._made_since += 1
        if self._copy is None or self._made_since >= self.every:
            model = from_object(obj, self.model, "model", self.where)
            self._copy = (self.row_step(), _copied(model.state_dict(), self.device),
                          _copied(_unwrapped(optimizer).state_dict(), self.device))
            self._made_since = 0

    def _undo(self, obj: Any, optimizer: Any, why: str) -> None:
        step = self.row_step()
        if self._copy is None:
            return  # no good update yet: nothing made to undo, the skip is all
        after, weights, state = self._copy
        model = from_object(obj, self.model, "model", self.where)
        model.load_state_dict(weights)
        inner = _unwrapped(optimizer)
        # The optimizer's state goes back, not its settings: the learning rate a scheduler
        # has set since the copy stays (loading would restore the copy's too).
        settings = [{key: value for key, value in group.items() if key != "params"} for group in inner.param_groups]
        inner.load_state_dict(_copied(state, None))  # its own copy: the kept one stays as it is
        for group, kept in zip(inner.param_groups, settings):
            group.update(kept)
        self.rolled_back.append((step, after, why))
        self._made_since = 0
        log.warning("%s: rolled the model and optimizer back to their state after step %d (%d rollbacks so far).",
                    self.where, after, len(self.rolled_back))
        if self.logger is not None:
            self.logger.log(self.name, float(len(self.rolled_back)), step)
        if len(self.rolled_back) >= self.max_rollbacks:
            raise StopTraining(
                f"{self.where}: {len(self.rolled_back)} rollbacks (steps {', '.join(str(s) for s, _, _ in self.rolled_back)}"
                f"; the last: {why}): more than a bad batch. Lower the learning rate, or check the data "
                f"(max_rollbacks={self.max_rollbacks}).")

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rolled_back": [list(r) for r in self.rolled_back],
                "made_since": self._made_since}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rolled_back = [(int(s), int(a), str(w)) for s, a, w in state["rolled_back"]]
        # The copy is not in the state: after a resume the next good update is the first kept.
        self._copy, self._made_since = None, int(state["made_since"])


def _unwrapped(optimizer: Any) -> Any:
    """The torch optimizer a framework's wrapper holds (Lightning's ``LightningOptimizer``
    copies the optimizer's attributes, so a state loaded into it would not reach the
    optimizer that steps; accelerate's passes it on too), else ``optimizer``."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def _copied(state: Any, device: Any) -> Any:
    """``state`` (a state_dict), each tensor copied (onto ``device``; None: where it is)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to(device, copy=True) if device is not None else state.detach().clone()
    if isinstance(state, dict):
        return {key: _copied(value, device) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_copied(value, device) for value in state)
    return state


def closure_position(jp: JoinPointInfo) -> tuple[str, int] | None:
    """The name and position (after the object) of the join point's closure argument."""
    import inspect

    try:
        parameters = list(inspect.signature(jp.function).parameters)
    except (TypeError, ValueError):
        return None
    if jp.has_object:
        parameters = parameters[1:]
    for name in _CLOSURES:
        if name in parameters:
            return name, parameters.index(name)
    return None


def _closure_run_first(closure: tuple[str, int], args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The step's closure (given by name or position) runs now, the forward and
    backward whose loss and gradients are judged; the step is given one returning
    its result."""
    name, position = closure
    if name in kwargs:
        given = kwargs[name]
        if callable(given):
            result = given()
            return args, {**kwargs, name: lambda: result}
    elif position < len(args) and callable(args[position]):
        result = args[position]()
        return (*args[:position], lambda: result, *args[position + 1:]), kwargs
    return args, kwargs
