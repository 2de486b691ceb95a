"""``GradNorm`` and ``LRMonitor``: values of the optimization, recorded per step."""

from __future__ import annotations

import functools
import weakref
import warnings
from typing import Any, Callable

import torch

from ..errors import HookError, HookwrapWarning, SettingError
from ..extend import reader
from ._attach import CountingCallback, DefaultEvent, On, framework_grad_norm, positive_number, whole_number
from .logs_into import LogsInto, checked_logger, logged_name
from .grad_scaler import scale_of_gradients
from .readback import QueuesReadBacks, shared

__all__ = ["GradNorm", "LRMonitor", "LayerStats"]


class GradNorm(LogsInto, QueuesReadBacks, CountingCallback):
    """After each call of ``event`` (default ``"backward"``), the total ``norm_type``
    norm of the gradients of ``model`` (an attribute name of the hooked object, or
    the module; read from the join point's argument of that name first), every
    ``every`` calls. The norm is computed on the device and queued for read-back with
    the other shipped callbacks' values (:mod:`hookwrap.torch.readback`), not read
    each time. ``history`` holds ``(step, norm)`` (reading it, or ``last``, reads back
    what is still queued); ``logger`` (a MetricsLogger) gets it as ``name``
    (``grad_norm``; another name for each of several models), and
    with one the norms queued are settled into it at the end of ``fit`` however it
    ends (and at the other endings of ``hookwrap.extend.Defers``).

    Beside ``GradScaler`` (float16), the norm is that of the true, unscaled gradients,
    as a hand-written ``torch.amp`` loop, Lightning and transformers log it (after
    ``scaler.unscale_``): where they are still scaled, the norm is divided on the
    device by the scaler's scale (no host read, and no early ``unscale_``, so
    accumulation is untouched); on a step the scaler skips it is ``inf`` or ``nan``,
    as theirs is. Beside ``GradClip`` on the same event, it is the norm before
    clipping if attached before it, after clipping if after."""

    def __init__(self, model: Any = "model", norm_type: float = 2.0, every: int = 1,
                 event: str = "backward", logger: Any = None,
                 step_event: str | None = DefaultEvent("step"), name: str = "grad_norm") -> None:
        super().__init__(step_event)
        whole_number(every, "every", "GradNorm")
        if norm_type != float("-inf"):  # -inf: the smallest absolute value, as torch reads it
            positive_number(norm_type, "norm_type", "GradNorm", allow_inf=True, why="the p of the p-norm, or -inf")
        self.model, self.norm_type, self.every, self.event = model, norm_type, every, event
        self.name = logged_name(name, "GradNorm")
        self.logger = checked_logger(logger, "GradNorm")
        self._history: list[tuple[int, float]] = []
        self._queued = 0  # norms not yet read back
        self._window: Any = None  # on an update axis: the norm after the update's latest backward
        self.calls = 0

    listens = (On("post", "event", "measure", value="model", always=True),)
    _said_no_norm = False  # DeepSpeed computed no norm: said once

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        pairs = self.registrations(target, self.listens)
        if self._axis is not None and self.event != self._axis.update:
            # One norm per update, as the framework logs it: that of the gradients its
            # batches accumulated, measured after the last backward (before any clipping).
            pairs.append((f"post-{self._axis.update}", reader(self._update_done, "post-")))
        return pairs

    def measure(self, obj: Any, model: Any) -> None:
        if self._axis is not None and self.event != self._axis.update:
            if framework_grad_norm(obj) is None:  # else the framework's own, read once the update is done
                self._window = self._norm(obj, model)  # the last batch's is the update's
            return
        self.calls += 1
        if self.calls % self.every == 0:
            self._put(self._norm(obj, model))

    def _update_done(self, obj: Any) -> None:
        framework = framework_grad_norm(obj)
        norm = self._window if framework is None else self._framework_norm(framework)
        self._window = None
        if norm is None:
            return
        self.calls += 1
        if self.calls % self.every == 0:
            self._put(norm)

    def _norm(self, obj: Any, model: Any) -> Any:
        framework = framework_grad_norm(obj)
        if framework is not None:  # DeepSpeed: the gradients are its own, the norm its computed one
            return self._framework_norm(framework)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads:
            return None
        norm = total_norm(grads, self.norm_type).detach()
        scale = scale_of_gradients(obj)
        if scale is not None:  # a GradScaler's gradients, not unscaled yet: the true norm, on the device
            norm = norm / scale.to(norm.device)
        return norm

    def _framework_norm(self, norm_of_update: Callable[[], Any]) -> Any:
        if self.norm_type != 2.0:
            raise HookError(
                f"GradNorm(norm_type={self.norm_type}): the framework holds the gradients (DeepSpeed ZeRO "
                f"partitions them, p.grad is empty) and computes their 2-norm only, which GradNorm reports "
                f"there. Use GradNorm() (norm_type=2.0).")
        value = norm_of_update()
        if value is None:  # DeepSpeed computed none: ZeRO stage 0 stepping inside backward
            if not self._said_no_norm:
                self._said_no_norm = True
                warnings.warn(
                    "GradNorm: DeepSpeed computed no norm of this update's gradients "
                    "(engine.get_global_grad_norm() is None: ZeRO stage 0, where it steps inside "
                    "backward and the gradients are gone after), so GradNorm records none, as the "
                    "framework logs none. Use ZeRO stage 1 or more.", HookwrapWarning, stacklevel=2)
            return None
        return value.detach().float() if isinstance(value, torch.Tensor) else torch.tensor(float(value))

    def _put(self, norm: Any) -> None:
        if norm is None:
            return
        self._queued += 1
        shared().put(norm, functools.partial(self._read, self.step))
        if self.logger is not None:
            self.logger.log(self.name, norm, self.row_step())

    def _read(self, step: int, values: list[float]) -> None:
        self._queued -= 1
        self._history.append((step, values[0]))

    @property
    def history(self) -> list[tuple[int, float]]:
        """``(step, norm)`` of each norm measured (waits for those still queued)."""
        if self._queued:
            shared().read(wait=True)
        return self._history

    @property
    def last(self) -> float | None:
        return self.history[-1][1] if self.history else None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.calls = state["calls"]


def total_norm(tensors: list[Any], norm_type: float) -> Any:
    """The ``norm_type`` norm of all ``tensors`` together, a 0-dim tensor:
    ``torch.nn.utils.get_total_norm`` (torch 2.6+), else the same computed by hand
    (the norm of the per-tensor norms; ``inf`` is the largest absolute value), on
    the first tensor's device."""
    import torch

    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)
    if get_total_norm is not None:
        return get_total_norm(tensors, norm_type)
    p = float(norm_type)
    device = tensors[0].device
    norms = [torch.linalg.vector_norm(t.detach(), p).to(device) for t in tensors]
    return torch.linalg.vector_norm(torch.stack(norms), p)


class LRMonitor(LogsInto, CountingCallback):
    """After each call of ``event`` (default ``"optimizer_step"``), the learning rate
    of each parameter group of ``optimizer`` (the join point's argument of that name,
    else an attribute of the hooked object, or the optimizer itself). ``history``
    holds ``(step, [lr per group])`` each time they change; ``logger`` gets them as
    ``name`` (``lr``; ``lr/<i>`` for several groups), settled into it at the end of ``fit`` as
    ``GradNorm``'s norms are. Attached to an optimizer (its ``step`` the event), it
    reads that optimizer."""

    def __init__(self, optimizer: Any = "optimizer", event: str = "optimizer_step",
                 logger: Any = None, step_event: str | None = DefaultEvent("step"), name: str = "lr") -> None:
        super().__init__(step_event)
        self.optimizer, self.event = optimizer, event
        self.name = logged_name(name, "LRMonitor")
        self.logger = checked_logger(logger, "LRMonitor")
        self.history: list[tuple[int, list[float]]] = []
        self._reading: Any = None  # a weak reference to the optimizer read last,
        self._read_before: Any = None  # and to the one before it

    listens = (On("post", "event", "record", value="optimizer", always=True),)

    def record(self, obj: Any, optimizer: Any) -> None:
        reading = self._reading
        if reading is None or reading() is not optimizer:
            self._switch_to(optimizer)
        lrs = [float(group["lr"]) for group in optimizer.param_groups]
        if not self.history or self.history[-1][1] != lrs:
            self.history.append((self.step, lrs))
        if self.logger is not None:
            for i, lr in enumerate(lrs):
                self.logger.log(self.name if len(lrs) == 1 else f"{self.name}/{i}", lr, self.row_step())

    def _switch_to(self, optimizer: Any) -> None:
        """A new optimizer is read: one that replaced the last (a run that makes its
        optimizer anew) goes on; two read in turn (dcgan's D and G on one ``step``
        event) would share one row name, refused at the first return to the first."""
        before = self._read_before
        if before is not None and before() is optimizer:
            other = self._reading()
            raise HookError(
                f"LRMonitor: event {self.event!r} brings two optimizers in turn ({type(optimizer).__name__} and "
                f"{type(other).__name__}), and it logs one under {self.name!r}: their rates would share its rows. "
                f"Use one LRMonitor per optimizer, each kept to its own and named: under hookwrap run, "
                f"--callback \"LRMonitor(event='step', name='lr_D')\" --when 'obj is optimizerD' (one for each); "
                f"in Python, attach each to its optimizer (hw.add_callback(optimizerD, LRMonitor(event='step', "
                f"name='lr_D'))).")
        self._read_before = self._reading
        try:
            self._reading = weakref.ref(optimizer)
        except TypeError:  # not weakly referable: not told apart (the rows say what it read)
            self._reading = None

    @property
    def last(self) -> list[float] | None:
        return self.history[-1][1] if self.history else None


_HISTOGRAMS = "\0histograms"  # the key of LayerStats' histograms among its stats (no parameter's name)


def _on_host(named: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Each tensor as a NumPy array on the host, all copied in one read (one flat
    float32 tensor), then split there: what TensorBoard bins."""
    if not named:
        return []
    flat: Any = torch.cat([t.reshape(-1).to(named[0][1].device, torch.float32) for _, t in named]).cpu().numpy()
    ends, arrays = 0, []
    for name, t in named:
        arrays.append((name, flat[ends:ends + t.numel()].reshape(tuple(t.shape))))
        ends += t.numel()
    return arrays


class LayerStats(GradNorm):
    """Per-layer statistics, every ``every`` calls of ``event`` (default
    ``"backward"``; on a framework's preset, once per update after its last
    backward, as ``GradNorm``): the ``norm_type`` norm of each parameter's gradient,
    logged as ``<name>/<parameter>`` (``grad_norm/layer.weight``, the values of
    Lightning's ``grad_norm`` utility), and with ``weights`` the norm of each
    parameter, ``weight_norm/<parameter>``, into ``logger`` (a MetricsLogger; under
    ``hookwrap run`` the run's). Computed on the device and queued with the other
    shipped callbacks' values: one read-back per logging interval, not one per
    layer. Gradients a ``GradScaler`` holds scaled are reported unscaled.

    With ``histograms=True``, each interval also sends TensorBoard a histogram of
    each parameter's gradient (``grads/<parameter>``) and, with ``weights``, of its
    values (``weights/<parameter>``), as ignite's ``GradsHistHandler`` and
    ``WeightsHistHandler`` name them: all copied to the host in one read, then
    binned there. The logger must write TensorBoard (``tensorboard=``)."""

    def __init__(self, model: Any = "model", every: int = 50, event: str = "backward", logger: Any = None,
                 weights: bool = True, norm_type: float = 2.0, step_event: str | None = DefaultEvent("step"),
                 name: str = "grad_norm", histograms: bool = False) -> None:
        super().__init__(model, norm_type, every, event, logger, step_event, name)
        self.name += "/"  # a prefix: its rows are <name>/<parameter>, apart from GradNorm's <name>
        for setting, value in (("weights", weights), ("histograms", histograms)):
            if not isinstance(value, bool):
                raise SettingError(f"LayerStats: {setting} must be True or False, got {value!r}.")
        self.weights, self.histograms = weights, histograms

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        if self.logger is None:
            raise SettingError("LayerStats: it logs one value per layer, which only a MetricsLogger can hold: "
                               "pass logger=MetricsLogger(...) (under hookwrap run, the run's is used).")
        if self.histograms and getattr(self.logger, "tensorboard", None) is None:
            raise SettingError("LayerStats: histograms=True sends TensorBoard histograms, and its logger writes "
                               "no TensorBoard: pass the MetricsLogger tensorboard= a folder (pip install "
                               "tensorboard).")
        return super().attach(target)

    def _norm(self, obj: Any, model: Any) -> Any:
        if framework_grad_norm(obj) is not None:
            raise HookError("LayerStats: the framework holds the gradients (DeepSpeed ZeRO partitions them, "
                            "p.grad is empty), so there is no gradient per layer to measure. Use GradNorm "
                            "for the norm DeepSpeed computes.")
        named = [(name, p) for name, p in model.named_parameters() if p.grad is not None]
        if not named:
            return None
        norms = [torch.linalg.vector_norm(p.grad.detach(), self.norm_type) for _, p in named]
        scale = scale_of_gradients(obj)
        if scale is not None:  # a GradScaler's gradients, not unscaled yet: the true norms, on the device
            norms = [norm / scale.to(norm.device) for norm in norms]
        stats: dict[str, Any] = {f"{self.name}{name}": norm for (name, _), norm in zip(named, norms)}
        if self.weights:
            stats.update((f"weight_norm/{name}", torch.linalg.vector_norm(p.detach(), self.norm_type))
                         for name, p in model.named_parameters())
        if self.histograms:
            stats[_HISTOGRAMS] = _on_host(
                [(f"grads/{name}", p.grad.detach() if scale is None else p.grad.detach() / scale.to(p.grad.device))
                 for name, p in named]
                + ([(f"weights/{name}", p.detach()) for name, p in model.named_parameters()] if self.weights else []))
        return stats

    def _put(self, stats: Any) -> None:
        if stats is None:
            return
        step = self.row_step()
        histograms = stats.pop(_HISTOGRAMS, ())
        for name, value in stats.items():  # each queued, read back together with the rest
            self.logger.log(name, value, step)
        for name, values in histograms:
            self.logger.log_histogram(name, values, step)

    @property
    def history(self) -> list[tuple[int, float]]:
        raise AttributeError("LayerStats keeps no history: its values are in its logger's rows "
                             "(grad_norm/<parameter>, weight_norm/<parameter>).")
