"""``MetricsLogger``: the loss and metrics to a CSV file, and to TensorBoard."""

from __future__ import annotations

import csv
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from ..extend import reader
from ._attach import DefaultEvent, CountingCallback, is_rank_zero, to_float, whole_number
from .readback import shared

__all__ = ["MetricsLogger", "tensorboard_available"]


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class MetricsLogger(CountingCallback):
    """Writes rows ``step,name,value`` to the CSV file ``path``: the loss (what
    ``loss_event`` returns, every ``every`` steps: each reads a value back from the
    device), every metric ``metrics_event`` returns, and whatever other callbacks
    ``log()`` (GradNorm's ``grad_norm``, LRMonitor's ``lr``).

    A tensor value is not read back when logged: it is queued on its device and
    read with the other shipped callbacks' values (:mod:`hookwrap.torch.readback`),
    at the latest when the epoch ends (asynchronously on CUDA: a row whose copy is
    still running is written at the next flush) or when ``fit_event`` returns,
    ``read()`` is called or the logger is pickled (waiting for the device).

    ``tensorboard``: a log folder for ``torch.utils.tensorboard`` too; ``None`` (the
    default) writes one beside the CSV when the ``tensorboard`` package is installed,
    ``False`` never does. Rows are flushed after each epoch and the files closed when
    ``fit_event`` returns. A resumed run (``load_callback_state``) appends. Under
    torch.distributed only rank 0 writes (``rank_zero_only``); elsewhere ``log()``
    drops its values without reading them back from the device.
    """

    rank_zero_only = True

    def __init__(self, path: str | os.PathLike[str], *, every: int = 1,
                 loss_event: str | None = DefaultEvent("loss"),
                 metrics_event: str | None = DefaultEvent("evaluate"),
                 epoch_event: str | None = DefaultEvent("epoch"),
                 fit_event: str | None = DefaultEvent("fit"),
                 tensorboard: str | os.PathLike[str] | bool | None = None,
                 step_event: str | None = DefaultEvent("step")) -> None:
        super().__init__(step_event)
        self.path, self.every = Path(path), whole_number(every, "every", "MetricsLogger")
        self.events = {"loss": loss_event, "metrics": metrics_event, "epoch": epoch_event,
                       "fit": fit_event}
        if tensorboard is None:
            tensorboard = tensorboard_available()
        elif tensorboard is not False and not tensorboard_available():
            raise ImportError(f"MetricsLogger(tensorboard={tensorboard!r}) needs the tensorboard "
                              f"package: pip install tensorboard (or pass tensorboard=False).")
        if tensorboard is True:
            tensorboard = self.path.with_name(self.path.stem + "_tensorboard")
        self.tensorboard_dir = Path(tensorboard) if tensorboard else None
        self.losses = 0
        self.rows: list[list[Any]] = []  # [step, name, value] not yet written; value None until read
        self._file: Any = None
        self._writer: Any = None

    @property
    def state_key(self) -> str:
        return f"MetricsLogger[{self.path}]"

    def attach(self, target: type | None) -> list[tuple[str, Callable[..., Any]]]:
        e = {k: v for k, v in self.events.items() if self.wants(target, v)}
        pairs: list[tuple[str, Callable[..., Any]]] = []
        if "loss" in e:
            pairs.append((f"post-{e['loss']}", reader(self.record_loss, "post-", "return_value")))
        if "metrics" in e:
            pairs.append((f"post-{e['metrics']}", reader(self.record_metrics, "post-", "return_value")))
        if "epoch" in e:
            pairs.append((f"post-{e['epoch']}", reader(self.end_of_epoch, "post-")))
        if "fit" in e:
            pairs.append((f"post-{e['fit']}", reader(self.close, "post-")))
            pairs.append((f"error-{e['fit']}", reader(self.close, "error-")))
        return pairs

    def log(self, name: str, value: Any, step: int | None = None) -> None:
        """Record one value (written at the next flush). A tensor (one element) is
        queued for read-back, not read now."""
        if not is_rank_zero():  # another callback's value, on a rank that never flushes
            return
        row: list[Any] = [self.step if step is None else step, name, None]
        if hasattr(value, "detach") and value.numel() == 1:
            shared().put(value, functools.partial(_fill, row))
        else:
            row[2] = to_float(value)
        self.rows.append(row)

    def record_loss(self, obj: Any, value: Any) -> None:
        self.losses += 1
        if self.losses % self.every == 0:
            self.log("loss", value)

    def record_metrics(self, obj: Any, value: Any) -> None:
        if isinstance(value, Mapping):
            for name, metric in value.items():
                self.log(str(name), metric)
        else:
            self.log("metric", value)

    def end_of_epoch(self, obj: Any = None) -> None:
        shared().read()  # what is queued (CUDA: the copies done by now)
        self.flush()

    def flush(self, obj: Any = None) -> None:
        """Write the rows whose values have been read (in order: up to the first
        still waiting for the device)."""
        ready = 0
        while ready < len(self.rows) and self.rows[ready][2] is not None:
            ready += 1
        rows, self.rows = [tuple(row) for row in self.rows[:ready]], self.rows[ready:]
        if not rows:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._file = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115
            if new:
                self._file.write("step,name,value\n")
        csv.writer(self._file).writerows(rows)
        self._file.flush()
        if self.tensorboard_dir is not None:
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.tensorboard_dir))
            for step, name, value in rows:
                self._writer.add_scalar(name, value, step)
            self._writer.flush()

    def close(self, obj: Any = None) -> None:
        """Write what is pending (waiting for values still on the device) and close
        the files (a later row reopens them)."""
        if any(row[2] is None for row in self.rows):
            shared().read(wait=True)
        self.flush()
        file, self._file = self._file, None
        writer, self._writer = self._writer, None
        if file is not None:
            file.close()
        if writer is not None:
            writer.close()

    def read(self) -> list[tuple[int, str, float]]:
        """The rows logged so far, parsed back from the CSV file (waits for values
        still on the device)."""
        if any(row[2] is None for row in self.rows):
            shared().read(wait=True)
        self.flush()
        if not self.path.exists():
            return []
        with open(self.path, newline="", encoding="utf-8") as f:
            return [(int(r["step"]), r["name"], float(r["value"])) for r in csv.DictReader(f)]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "losses": self.losses}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.losses = state["losses"]

    def __getstate__(self) -> dict[str, Any]:
        if any(row[2] is None for row in self.rows):
            shared().read(wait=True)
        self.flush()
        return {**self.__dict__, "_file": None, "_writer": None}  # open files do not pickle


def _fill(row: list[Any], values: list[float]) -> None:
    row[2] = values[0]
