"""``ProgressBar``: a tqdm bar per epoch with the live loss and metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from ..errors import HookError
from ..extend import Defers, Ending
from ._attach import DefaultEvent, On, ShippedCallback, to_float, whole_number
from .readback import QueuesReadBacks, shared

__all__ = ["ProgressBar"]


class ProgressBar(Defers, QueuesReadBacks, ShippedCallback):
    """One tqdm bar per call of ``epoch_event``, advanced by each ``step_event``, with
    the last loss (what ``loss_event`` returns) and the metrics ``metrics_event``
    returns in its postfix.

    The bar never waits for the device: a loss tensor is queued for read-back every
    ``postfix_every`` losses (the first, then every ``postfix_every``-th) and read with
    the other shipped callbacks' values (:mod:`hookwrap.torch.readback`: NanGuard's
    reads), or by the bar itself when its loss has waited ``read_every`` steps and
    when the epoch ends (on CUDA without waiting: a copy still running shows
    later). The bar closes when ``fit_event`` ends, however it ends (a stop, an
    error), or another ending of ``hookwrap.extend.Defers`` comes. The postfix shows the last loss read, refreshed every ``postfix_every``
    steps. A plain number is shown as it comes. ``total`` is the number of steps per
    epoch, when known. Under torch.distributed the bar shows on rank 0 only
    (``rank_zero_only``). Other keywords go to ``tqdm`` (``file=``, ``ncols=``, ...).
    """

    rank_zero_only = True

    def __init__(self, total: int | None = None, *, postfix_every: int = 10, read_every: int = 100,
                 epoch_event: str = "epoch", step_event: str = "step",
                 loss_event: str | None = DefaultEvent("loss"),
                 metrics_event: str | None = DefaultEvent("evaluate"),
                 fit_event: str | None = DefaultEvent("fit"), **tqdm_kwargs: Any) -> None:
        import tqdm  # noqa: F401  # fail at construction, not at the first epoch

        self.total, self.tqdm_kwargs = total, tqdm_kwargs
        self.postfix_every = whole_number(postfix_every, "postfix_every", "ProgressBar")
        self.read_every = whole_number(read_every, "read_every", "ProgressBar")
        self.steps = 0
        self._unread = 0  # losses queued, not yet read back
        self._unread_since = 0  # the step when the oldest of them was queued
        self.events = {"epoch": epoch_event, "step": step_event, "loss": loss_event,
                       "metrics": metrics_event, "fit": fit_event}
        self.bar: Any = None
        self.epochs = 0
        self.loss: float | None = None  # the last loss read
        self.losses = 0  # losses seen
        self.metrics: dict[str, str] = {}  # formatted for the postfix
        self.run_event = fit_event

    def attach(self, target: type | None) -> list[tuple[str, Callable[..., Any]]]:
        e = {k: v for k, v in self.events.items() if self.wants(target, v)}
        for required in ("epoch", "step"):
            if required not in e:
                raise HookError(f"ProgressBar: {required}_event is required: name the join point of "
                                f"each {required} ({required}_event=...).")
        self._closes_at_fit = "fit" in e
        # fit_event: a boundary (Defers), where the bar closes however the run ends
        return self.registrations(target, self.listens, e)

    listens = (On("pre", "epoch", "open"), On("post", "step", "advance"), On("post", "epoch", "close"),
               On("post", "loss", "record_loss", read="return_value"),
               On("post", "metrics", "record_metrics", read="return_value"))

    def defers(self) -> bool:
        # The bar's own boundary is the epoch: only a run's end (a stop, an error) adds one.
        return bool(getattr(self, "_closes_at_fit", False))

    def settle(self, obj: Any, ending: Ending) -> None:
        """A boundary (``hookwrap.extend.Defers``): the bar shows the last loss read, and closes."""
        self.close(obj)

    def open(self, obj: Any) -> None:
        from tqdm.auto import tqdm

        self.close(obj)
        self.epochs += 1
        kwargs = {"desc": f"epoch {self.epochs}", "total": self.total, "leave": True,
                  "dynamic_ncols": True, **self.tqdm_kwargs}
        self.bar = tqdm(**kwargs)
        if self.metrics:
            self.bar.set_postfix(self.metrics, refresh=False)

    def advance(self, obj: Any) -> None:
        bar = self.bar
        if bar is None:
            return
        bar.update(1)
        self.steps += 1
        if self._unread and self.steps - self._unread_since >= self.read_every:
            shared().read()
        if self.loss is not None and bar.n % self.postfix_every == 0:
            bar.set_postfix(self._with_loss(), refresh=False)

    def _with_loss(self) -> dict[str, str]:
        return {"loss": f"{self.loss:.4f}", **self.metrics}  # the last value read

    def record_loss(self, obj: Any, value: Any) -> None:
        if value is None:
            return
        self.losses += 1
        if not hasattr(value, "detach"):  # a plain number: nothing to read back
            self.loss = float(value)
        elif (self.losses - 1) % self.postfix_every == 0:
            if not self._unread:
                self._unread_since = self.steps
            self._unread += 1
            shared().put(value, self._loss_read)  # read with the next read-back

    def _loss_read(self, values: list[float]) -> None:
        self._unread -= 1
        self.loss = values[0]

    def record_metrics(self, obj: Any, value: Any) -> None:
        if isinstance(value, Mapping):
            self.metrics = {str(k): f"{to_float(v):.4f}" for k, v in value.items()}
        else:
            self.metrics = {"metric": f"{to_float(value):.4f}"}
        if self.bar is not None:
            self.bar.set_postfix(self.metrics)

    def close(self, obj: Any) -> None:
        bar, self.bar = self.bar, None
        if bar is not None:
            if self._unread:
                shared().read()
            if self.loss is not None:
                bar.set_postfix(self._with_loss(), refresh=False)
            bar.close()
