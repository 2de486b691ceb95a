"""``MetricsLogger``: the loss and metrics, read back in batches, sent to any number
of loggers: a CSV file, TensorBoard, and any object with ``log_metrics(metrics,
step)`` (Lightning's loggers: CSV, TensorBoard, W&B, MLflow, Comet, Neptune)."""

from __future__ import annotations

import csv
import functools
import importlib
import logging
import math
import operator
import os
import time
import types
import warnings
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Callable, NamedTuple, NoReturn, Protocol

from ..errors import HookError, HookwrapWarning, SettingError
from ..extend import Defers, Ending, has_join_point, track_deferring
from ._attach import DefaultEvent, CountingCallback, On, is_rank_zero, positive_number, to_float, whole_number
from .checkpoint_io import local_path
from .distributed import is_distributed
from .readback import settle as settle_decisions
from .readback import QueuesReadBacks, shared

__all__ = ["CSVWriter", "LogRecords", "MetricsLogger", "MetricsSink", "TensorBoardWriter", "tensorboard_available"]


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class MetricsSink(Protocol):
    """What ``MetricsLogger(loggers=[...])`` sends to: the method Lightning's loggers
    implement (``lightning.pytorch.loggers.Logger.log_metrics``), so they plug in
    unchanged, as does the ``mlflow`` module itself. ``metrics`` holds the values of
    one step, as Python floats; calls come in step order.

    Optional, called when present: ``save()`` after each batch of calls (as
    Lightning's trainer does), and ``finalize(status)`` when the run ends
    (``"success"``, or ``"failed"`` when ``fit`` raised), else ``save()`` there."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> object: ...


def _open_rows(path: Path) -> Any:
    """``path`` opened to append ``step,name,value`` rows, its folder made, the header
    written first in a new (or empty) file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    file = open(path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - the caller closes it
    if new:
        file.write("step,name,value\n")
    return file


class CSVWriter:
    """Rows ``step,name,value`` to the CSV file ``path`` (appending to what is there,
    a header first in a new file): the logger ``MetricsLogger(path)`` writes with.

    A resumed run (``resume_at``) logs again the steps that followed its checkpoint:
    when its first row comes, the rows written after the checkpoint's state was saved
    at that step or later are moved to ``<name>.before-resume.csv`` beside the file
    (said with a ``HookwrapWarning``), so the CSV holds each step once, as the
    uninterrupted run's does, and nothing written is lost."""

    def __init__(self, path: str | os.PathLike[str], wide: bool = False) -> None:
        self.path = Path(path)
        self.wide = wide  # also <stem>.wide.csv, a column per name, written when finalized
        self._file: Any = None
        self._resumed_at: int | None = None  # the file's size when the state resumed was saved

    def size(self) -> int | None:
        """The bytes written so far (None: no file yet)."""
        self.save()
        return self.path.stat().st_size if self.path.exists() else None

    def resume_at(self, size: int) -> None:
        """A resumed run goes on from when the file held ``size`` bytes; what was
        written after that is sorted out at its first row (``_set_aside_redone``)."""
        self.finalize("success")
        self._resumed_at = size

    def __repr__(self) -> str:
        return f"CSVWriter({str(self.path)!r})"

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        said = self._set_aside_redone(self._resumed_at, step) if self._resumed_at is not None else None
        if self._file is None:
            self._file = _open_rows(self.path)
            weakref.finalize(self, self._file.close)  # a writer dropped mid-run closes it quietly
        csv.writer(self._file).writerows((step, name, value) for name, value in metrics.items())
        if said:  # once the rows are written: a warning turned error loses none
            warnings.warn(said, HookwrapWarning, stacklevel=2)

    def save(self) -> None:
        if self._file is not None:
            self._file.flush()

    def _set_aside_redone(self, size: int, step: int) -> str | None:
        """The rows past byte ``size`` at ``step`` or later, which the resumed run logs
        again from ``step``, moved to the ``.before-resume.csv`` file beside this one;
        returns what to say of it."""
        import io

        self._resumed_at = None
        if not self.path.exists():
            return None
        with open(self.path, "r+b") as f:
            if size > os.fstat(f.fileno()).st_size:
                return None  # shorter than when the state was saved: not the file it counted
            f.seek(max(size - 1, 0))
            if size == 0:
                size = len(f.readline())  # the header, written with the first row
            elif f.read(1) != b"\n":
                return None  # not a row's end: not the file it counted
            tail = f.read().decode("utf-8")
            rows = list(csv.reader(io.StringIO(tail, newline="")))
            redone = [row for row in rows if row and int(row[0]) >= step]
            if not redone:
                return None
            kept = io.StringIO(newline="")
            csv.writer(kept).writerows(row for row in rows if row and int(row[0]) < step)
            f.seek(size)
            f.truncate()
            f.write(kept.getvalue().encode("utf-8"))
        aside = self.path.with_name(f"{self.path.stem}.before-resume{self.path.suffix}")
        with _open_rows(aside) as out:
            csv.writer(out).writerows(redone)
        steps = sorted({int(row[0]) for row in redone})
        return (f"MetricsLogger: {self.path}: the run resumed from a state saved before {len(redone)} rows of "
                f"steps {steps[0]}-{steps[-1]} were written, and logs from step {step} again: those rows were moved "
                f"to {aside}, so the CSV holds each step once.")

    def finalize(self, status: str) -> None:
        """Close the file (a later row reopens it); with ``wide``, write the wide copy."""
        file, self._file = self._file, None
        if file is not None:
            file.close()
        if self.wide and self.path.exists():
            self.write_wide()

    @property
    def wide_path(self) -> Path:
        return self.path.with_name(f"{self.path.stem}.wide{self.path.suffix}")

    def write_wide(self) -> None:
        """``<stem>.wide.csv``: the rows as a table, ``step`` then a column per name (in
        the order first logged), a row per step, or more where a name was logged
        again in the step (a loss per micro-batch), empty cells where a name was not
        logged; what pandas' ``read_csv`` and Lightning's ``CSVLogger`` give. Written
        whole (a temporary file, then renamed) from the long file, which stays the
        record: a run killed before its end has every row there."""
        names: dict[str, None] = {}
        table: list[dict[str, Any]] = []
        for step, name, value in self.read():
            names.setdefault(name)
            if not table or table[-1]["step"] != step or name in table[-1]:
                table.append({"step": step})
            table[-1][name] = value
        temporary = self.wide_path.with_name(self.wide_path.name + ".tmp")
        with open(temporary, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, ["step", *names])
            writer.writeheader()
            writer.writerows(table)
        os.replace(temporary, self.wide_path)

    def read(self) -> list[tuple[int, str, float]]:
        """The rows of the file, parsed (what was written so far)."""
        self.save()
        if not self.path.exists():
            return []
        with open(self.path, newline="", encoding="utf-8") as f:
            return [(int(r["step"]), r["name"], float(r["value"])) for r in csv.DictReader(f)]

    def __getstate__(self) -> dict[str, Any]:
        self.save()
        return {**self.__dict__, "_file": None}  # an open file does not pickle


class TensorBoardWriter:
    """Scalars to a TensorBoard log folder ``dir`` (``torch.utils.tensorboard``):
    the logger ``MetricsLogger(path, tensorboard=...)`` writes with."""

    def __init__(self, dir: str | os.PathLike[str]) -> None:
        self.dir = Path(dir)
        self._writer: Any = None
        self._resumed = False

    def resume(self) -> None:
        """A resumed run logs again the steps that followed its checkpoint: its first
        value's step is the ``purge_step`` of the next event file, so TensorBoard
        drops the earlier run's values from that step on, as for a crashed and
        resumed experiment."""
        self.finalize("success")
        self._resumed = True

    def __repr__(self) -> str:
        return f"TensorBoardWriter({str(self.dir)!r})"

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        writer = self._opened(step)
        for name, value in metrics.items():
            writer.add_scalar(name, value, step)

    def _opened(self, step: int) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            purge, self._resumed = self._resumed, False
            self._writer = SummaryWriter(str(self.dir), purge_step=step if purge else None)
        return self._writer

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        """A histogram of ``values`` (a tensor on the CPU) at ``step``."""
        self._opened(step).add_histogram(name, values, step)

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status: str) -> None:
        """Close the event file (a later value opens a new one)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def __getstate__(self) -> dict[str, Any]:
        self.save()
        return {**self.__dict__, "_writer": None}


class LogRecords:
    """Rows to a ``logging.Logger``, one INFO record per step (``step 12: loss=0.25,
    lr=0.001``): what ``MetricsLogger(loggers=[logging.getLogger(...)])`` and a
    callback's ``logger=logging.getLogger(...)`` send to. The record carries the
    step and the metrics as ``extra`` (``record.step``, ``record.metrics``) for a
    handler that wants the numbers."""

    def __init__(self, logger: logging.Logger, level: int = logging.INFO) -> None:
        self.logger = logger
        self.level = level

    def __repr__(self) -> str:
        return f"LogRecords({self.logger.name!r})"

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if self.logger.isEnabledFor(self.level):
            text = ", ".join(f"{name}={value:.6g}" for name, value in metrics.items())
            self.logger.log(self.level, "step %d: %s", step, text,
                            extra={"step": step, "metrics": dict(metrics)})

    def __reduce__(self) -> Any:
        return (_log_records, (self.logger.name, self.level))  # loggers pickle by name


def _log_records(name: str, level: int) -> LogRecords:
    return LogRecords(logging.getLogger(name), level)


class WandbRun:
    """Rows to Weights & Biases with no Lightning installed: what
    ``MetricsLogger(loggers=[run])`` makes of a W&B run (``wandb.init(...)``) or of
    the ``wandb`` module (its current run). Each step's values are one
    ``run.log({..., "global_step": step})``, as Lightning's ``WandbLogger`` sends
    them (its ``trainer/global_step``): W&B's own step counts the calls, so a
    resumed run that logs a step again is not dropped as going back."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def __repr__(self) -> str:
        return f"WandbRun({self.run!r})"

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({**metrics, "global_step": step})

    def __reduce__(self) -> Any:
        if isinstance(self.run, types.ModuleType):  # the module pickles by name, as mlflow's
            return (_wandb_module, (self.run.__name__,))
        return (WandbRun, (self.run,))


def _wandb_module(name: str) -> WandbRun:
    return WandbRun(importlib.import_module(name))


def _is_wandb(logger: Any) -> bool:
    """The ``wandb`` module, or one of its runs: a ``log`` and no ``log_metrics``."""
    module = logger.__name__ if isinstance(logger, types.ModuleType) else type(logger).__module__
    return module.split(".")[0] == "wandb" and callable(getattr(logger, "log", None)) \
        and not hasattr(logger, "log_metrics")


class MetricsLogger(Defers, QueuesReadBacks, CountingCallback):
    """Logs the loss (what ``loss_event`` returns, every ``every`` steps), every
    metric ``metrics_event`` returns, and whatever other callbacks ``log()``
    (GradNorm's ``grad_norm``, LRMonitor's ``lr``), and sends them to:

    * ``path``: rows ``step,name,value`` in a CSV file (``CSVWriter``), and a
      TensorBoard folder: ``tensorboard=None`` (the default) writes one beside the
      CSV when the ``tensorboard`` package is installed, ``False`` never, a folder
      there (``TensorBoardWriter``; with ``path=None`` too);
    * ``loggers``: any number of objects with ``log_metrics(metrics: dict[str,
      float], step: int)`` (``MetricsSink``): Lightning's ``CSVLogger``,
      ``TensorBoardLogger``, ``WandbLogger``, ``MLFlowLogger``, ``CometLogger``,
      ``NeptuneLogger`` unchanged, the ``mlflow`` module, or a class of your own;
      or a ``logging.Logger``: an INFO record a step (``LogRecords``).

    With ``wide=True`` the CSV file also gets a wide copy, ``<stem>.wide.csv`` (``step``
    and a column per name, as pandas users and Lightning's ``CSVLogger`` read it),
    written at each boundary below from the long file, which stays the record.

    At least one is needed. Each row is numbered by this callback's step count
    (the updates, on a framework: its global step), or, with ``step_from``, by what
    that function returns when the row is logged: a loop's own counter (``lambda:
    trainer.iteration``; ``hookwrap run --step iter_num``), for every row, those
    other callbacks log into it included.

    On a framework's preset with a ``log`` join point
    (``log_event``: transformers, Lightning), it logs what the framework logs, on the
    framework's step axis: each row the framework logs (HF's ``log_history`` rows,
    what Lightning gives its loggers), so the CSV and the framework's own logs agree
    (under gradient accumulation, one loss per optimizer step, at ``global_step``);
    ``loss_event`` and ``metrics_event`` are then not read unless passed (the
    framework's rows have them already). A tensor value is not read back when logged: it is
    queued on its device and read with the other shipped callbacks' values
    (:mod:`hookwrap.torch.readback`), and the rows read are sent in batches: when
    an epoch ends (asynchronously on CUDA: a row whose copy is still running goes
    at the next flush), when 1024 rows wait (the current step's stay for the
    next), every ``flush_secs`` seconds (10; None: only at the boundaries below)
    with what is read by then, and at every boundary of its lifecycle
    (``hookwrap.extend.Defers``), waiting for the device: when ``fit_event`` ends
    (it returned, a ``StopTraining`` or another exception left it), or the
    outermost running ``fit`` of another object that drove this one; when
    ``callback_state`` is taken, ``read()`` is called or the logger is pickled; at
    the end of a ``hookwrap run`` script or a ``with hookwrap.extend.boundary():``
    block; on SIGTERM (``hookwrap.settle_on_signals`` for others); at interpreter
    exit (reported on stderr). Nothing logged is lost however the run ends; on a
    loop with no ``fit`` no step costs a read of its own. A batch gives each logger one
    ``log_metrics(metrics, step)`` per step, in step order (a name logged twice in
    a step, a second call; the evaluation after an epoch's flush, a call of its
    own for that step), then ``save()`` where it has one. When ``fit_event``
    ends, each logger's ``finalize("success")`` is called (also when stopped;
    ``"failed"`` when it raises), else its ``save()``. A value that is not one
    number (a confusion matrix in the metrics) is left out, with a
    ``HookwrapWarning`` naming its key and the fix, once per key: a logger never
    ends a run.

    A logger that raises misses the rest of that batch; the other loggers still
    get theirs, and then its exception propagates with a note naming it and the
    steps it missed (when ``fit`` failed already: a note on that error instead).
    A resumed run (``load_callback_state``) appends, and logs again the steps
    that followed its checkpoint: their earlier rows are moved out of the CSV to
    ``<name>.before-resume.csv`` (``CSVWriter``) and purged from TensorBoard, so
    each step appears once. Under torch.distributed only
    rank 0 logs (``rank_zero_only``); elsewhere ``log()`` drops its values without
    reading them back from the device.
    """

    rank_zero_only = True
    _group = 0  # the rows being logged now: 0, or an evaluation's own group (see record_metrics)
    max_rows = 1024  # rows waiting that trigger a flush of those read (no read of its own)

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 loggers: Iterable[MetricsSink | logging.Logger] | MetricsSink | logging.Logger = (), every: int = 1,
                 loss_event: str | None = DefaultEvent("loss"),
                 metrics_event: str | None = DefaultEvent("evaluate"),
                 epoch_event: str | None = DefaultEvent("epoch"),
                 fit_event: str | None = DefaultEvent("fit"),
                 tensorboard: str | os.PathLike[str] | bool | None = None, wide: bool = False,
                 step_event: str | None = DefaultEvent("step"), flush_secs: float | None = 10.0,
                 log_event: str | None = DefaultEvent("log"), step_from: Callable[[], Any] | None = None) -> None:
        super().__init__(step_event)
        if step_from is not None and not callable(step_from):
            raise SettingError(f"MetricsLogger: step_from must be a function returning the loop's own step "
                               f"number (lambda: trainer.iteration), or None, got {step_from!r}.")
        self.step_from = step_from
        if path is not None and not hasattr(path, "log_metrics") and not isinstance(path, (str, os.PathLike)):
            raise SettingError(f"MetricsLogger: path must be the CSV file's path (a str or os.PathLike), or None, "
                               f"got {path!r}.")
        if path is not None and hasattr(path, "log_metrics"):
            raise HookError(f"MetricsLogger: path is hookwrap's own CSV file, and {_name(path)} is a "
                            f"logger: pass it as loggers=[...].")
        self.path = local_path(path, f"MetricsLogger({os.fspath(path)!r})") if path is not None else None
        self.every = whole_number(every, "every", "MetricsLogger")
        self.loggers = _check_loggers(loggers)
        self.events = {"loss": loss_event, "metrics": metrics_event, "epoch": epoch_event,
                       "fit": fit_event, "log": log_event}
        if tensorboard is None:
            tensorboard = self.path is not None and tensorboard_available()
        elif tensorboard is not False and not tensorboard_available():
            raise ImportError(f"MetricsLogger(tensorboard={tensorboard!r}) needs the tensorboard "
                              f"package: pip install tensorboard (or pass tensorboard=False).")
        if tensorboard is True:
            if self.path is None:
                raise HookError("MetricsLogger: tensorboard=True writes beside the CSV file, and there is "
                                "none (path=None): pass tensorboard= a folder, or path=.")
            tensorboard = self.path.with_name(self.path.stem + "_tensorboard")
        self.tensorboard_dir = local_path(tensorboard, f"MetricsLogger(tensorboard={os.fspath(tensorboard)!r})") \
            if tensorboard else None
        if not isinstance(wide, bool):
            raise SettingError(f"MetricsLogger: wide must be True or False, got {wide!r}.")
        if wide and self.path is None:
            raise SettingError("MetricsLogger: wide=True writes a wide copy of the CSV file, and there is none "
                               "(path=None): pass path= too.")
        self.csv = CSVWriter(self.path, wide=wide) if self.path is not None else None
        self.tensorboard = TensorBoardWriter(self.tensorboard_dir) if self.tensorboard_dir else None
        if not self.sinks:
            raise HookError("MetricsLogger: nothing to log to. Pass path= (a CSV file) and/or loggers=[...] "
                            "(objects with log_metrics(metrics, step), such as Lightning's loggers).")
        self.losses = 0
        self._update_loss: Any = None  # on a loop counting updates: the sum of this update's batch losses
        self._update_batches = self._update_step = 0
        self._refused: set[str] = set()  # names of values left out (not one number), each said once
        self._training_rows = 0  # framework rows of training (not evaluation) values
        self._reads_rows = self._warned = False
        self._rows_of: dict[type, bool] | None = None  # on the global tier: which classes log their own rows
        self.rows: list[list[Any]] = []  # [step, name, value, group] not yet sent; value None until read
        self._flush_at = self.max_rows
        if flush_secs is not None:
            positive_number(flush_secs, "flush_secs", "MetricsLogger", why="seconds between writes, or None")
        self.flush_secs = flush_secs
        self._flush_due = time.monotonic() + flush_secs if flush_secs is not None else math.inf
        self.run_event = fit_event
        track_deferring(self)  # settled at a script's end and at exit, attached or only logged into

    @property
    def sinks(self) -> list[Any]:
        """Where the rows go: the CSV writer, the TensorBoard writer, then ``loggers``."""
        return [s for s in (self.csv, self.tensorboard) if s is not None] + self.loggers

    @property
    def state_key(self) -> str:
        if self.path is not None:
            return f"MetricsLogger[{self.path}]"
        return f"MetricsLogger[{','.join(_name(s) for s in self.sinks)}]"

    def logs_rows_of(self, target: type | None) -> bool:
        """Does ``target`` (None: the global tier) have a join point this logger logs
        rows of (loss, metrics, epoch, a framework's log)? Without one it only takes
        other callbacks' values, and is not attached."""
        return any(self.wants(target, self.events[k]) for k in ("loss", "metrics", "epoch", "log"))

    def attach(self, target: type | None) -> list[tuple[str, Callable[..., Any]]]:
        e = {k: v for k, v in self.events.items() if self.wants(target, v)}
        self._rows_of = None
        if "log" in e and target is None:
            # The global tier reaches every class: an object whose class logs its own rows
            # has its default loss and metrics left out when they come (_framework_logs).
            self._rows_of = {}
        elif "log" in e:  # the framework's rows hold its loss and metrics: read again, they would log twice
            e = {k: v for k, v in e.items() if k not in ("loss", "metrics") or not isinstance(v, DefaultEvent)}
            if self.every != 1 and "loss" not in e:
                raise HookError(
                    f"MetricsLogger(every={self.every}): {getattr(target, '__qualname__', 'the target')} logs its "
                    f"own rows (join point {self.events['log']!r}), which this logger logs as they come: set how "
                    f"often the framework logs (HF logging_steps, Lightning log_every_n_steps), or pass "
                    f"loss_event='loss' to log every {self.every}-th loss call.")
        self._reads_rows = "log" in e
        if not {"loss", "metrics", "epoch", "log"} & set(e):
            raise HookError(
                f"MetricsLogger: {getattr(target, '__qualname__', 'the target')} has none of the join points it "
                f"logs: loss_event={self.events['loss']!r}, metrics_event={self.events['metrics']!r}, "
                f"epoch_event={self.events['epoch']!r}, so it would never log a row. Name yours "
                f"(MetricsLogger(..., loss_event='compute_loss', metrics_event='validate')), or weave them. "
                f"A MetricsLogger that only takes other callbacks' values (GradNorm(logger=...)) need not "
                f"be attached.")
        # fit_event: a boundary of the lifecycle (Defers), however it ends
        return self.registrations(target, self.listens, e)

    listens = (On("post", "loss", "record_loss", read="return_value"),
               On("post", "metrics", "record_metrics", read="return_value"),
               On("post", "epoch", "end_of_epoch"), On("pre", "log", "record_row", read="row"))

    def log(self, name: str, value: Any, step: int | None = None) -> None:
        """Record one value (sent at the next flush). A tensor (one element) is
        queued for read-back, not read now."""
        if not is_rank_zero():  # another callback's value, on a rank that never flushes
            return
        if not self._loggable(name, value, step):
            return
        if self.step_from is not None:  # the loop's own counter numbers every row
            step = self._loops_step()
        elif step is None:  # this callback's own step (said once when nothing counts it)
            step = self.step if self._uncounted_on is None else self.row_step()
        row: list[Any] = [step, name, None, self._group]
        if hasattr(value, "detach") and value.numel() == 1:
            shared().put(value, functools.partial(_fill, row))
        else:
            row[2] = to_float(value)
        self.rows.append(row)
        if len(self.rows) >= self._flush_at:  # what is read by now; no read of its own
            self._send(self._take(keep_step=self.step if self.step_from is None else step), raise_errors=True)
            self._flush_at = len(self.rows) + self.max_rows
        elif time.monotonic() >= self._flush_due:  # a file others follow, and less held at a kill
            self._flush_due = time.monotonic() + self.flush_secs  # type: ignore[operator]
            shared().read()  # no wait: on CUDA what is copied by now
            self._send(self._take(keep_step=row[0]), raise_errors=True)  # this step's others may follow

    def _loops_step(self) -> int:
        assert self.step_from is not None
        value = self.step_from()
        try:
            return operator.index(value)  # an int, a NumPy integer, a one-element integer tensor
        except TypeError:
            raise SettingError(f"MetricsLogger: step_from returned {value!r} ({type(value).__name__}), not a "
                               f"whole number: return the loop's step counter.") from None

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        """A histogram of ``values`` (a tensor on the CPU) to TensorBoard at ``step``,
        now (what ``LayerStats(histograms=True)`` sends). Only TensorBoard holds
        histograms: without it this is an error naming the fix, not a silent drop."""
        if not is_rank_zero():
            return
        if self.tensorboard is None:
            raise HookError(f"MetricsLogger: a histogram ({name!r}) goes to TensorBoard, and this logger writes "
                            f"none: pass tensorboard= a folder (pip install tensorboard).")
        self.tensorboard.log_histogram(name, values, self._loops_step() if self.step_from is not None else step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """The logger protocol (``MetricsSink``): each value, as ``log(name, value, step)``."""
        for name, value in metrics.items():
            self.log(str(name), value, step)

    def record_loss(self, obj: Any, value: Any) -> None:
        if isinstance(value, (tuple, list)):
            self._refuse("loss", (
                f"join point {self.events['loss']!r} returned a {type(value).__name__} of {len(value)} "
                f"({', '.join(type(v).__name__ for v in value)}), not one loss: a model's (logits, loss). Log "
                f"the loss itself: make the function that computes it the loss join point (hookwrap run "
                f"--weave loss=torch.nn.functional:cross_entropy; hw.weave), or pass loss_event= one that "
                f"returns it"))
            return
        if self._framework_logs(obj, "loss"):
            return
        if self._axis is not None and _is_scalar(value):
            self._add_to_update(value)
            return
        self.losses += 1
        if self.losses % self.every == 0:
            self.log("loss", value)

    def _add_to_update(self, value: Any) -> None:
        """A batch's loss on a loop that counts updates: the update's loss is the mean
        of its batches' (what HF logs under accumulation), one row at its step."""
        value = value.detach() if hasattr(value, "detach") else value  # summed on the device: no read
        self._update_loss = value if self._update_loss is None else self._update_loss + value
        self._update_batches += 1
        self._update_step = self.step

    def _log_update(self) -> None:
        """The loss of the update whose batches were added, as one row (when the next
        update opens, or at a boundary: a framework may say a batch's loss after its
        update, as Fabric's step event does)."""
        if not self._update_batches:
            return
        total, batches = self._update_loss, self._update_batches
        self._update_loss, self._update_batches = None, 0
        self.losses += 1
        if self.losses % self.every == 0:
            self.log("loss", total / batches, self._update_step)

    def _count_step(self, obj: Any) -> None:
        if self._update_batches:  # the update before this one is complete
            self._log_update()
        self.step += 1

    def _framework_logs(self, obj: Any, what: str) -> bool:
        """On the global tier: does ``obj``'s class log its own rows (a ``log`` join
        point), so that this default ``what`` event would log its values twice?"""
        rows_of = self._rows_of
        if rows_of is None or obj is None or not isinstance(self.events[what], DefaultEvent):
            return False
        cls = type(obj)
        logs = rows_of.get(cls)
        if logs is None:
            logs = rows_of[cls] = has_join_point(cls, str(self.events["log"]))
        return logs

    def record_metrics(self, obj: Any, value: Any) -> None:
        if self._framework_logs(obj, "metrics"):
            return
        self._log_update()  # an evaluation comes after the batches of the update it follows
        metrics = value if isinstance(value, Mapping) else {"metric": value}
        # An evaluation's values go in a log_metrics call of their own, as the frameworks
        # log them, even when they share a step (and a batch) with the training values.
        self._groups = self._group = getattr(self, "_groups", 0) + 1
        try:
            for name, metric in metrics.items():  # one that is not a number is reported and left out
                self.log(str(name), metric)
        finally:
            self._group = 0

    def record_row(self, obj: Any, row: Any) -> None:
        """A row the framework logged (join point ``log``): its values at its ``step``.
        One logged outside a run (``trainer.test()`` after ``fit``) is sent at once."""
        step = int(row["step"])
        values = {str(name): value for name, value in row.items() if name != "step"}
        for name, value in values.items():
            self.log(name, value, step)
        if not any(name.startswith(("eval", "val", "test")) or name == "train_runtime" for name in values):
            self._training_rows += 1
        if not self.in_boundary(obj):
            self.settle(obj, Ending("outermost"))

    def _loggable(self, name: str, value: Any, step: int | None) -> bool:
        """Is ``value`` one number? One that is not (a confusion matrix beside
        ``val_loss``) is reported once per name, naming the fix, and left out: a
        logger is a side job, and never ends a run (HF's loggers drop such values too)."""
        if isinstance(value, (int, float)):
            return True
        numel = getattr(value, "numel", None)
        if callable(numel):
            if numel() == 1:
                return True
            what = f"a tensor of shape {tuple(value.shape)}"
        elif hasattr(value, "__float__") and not isinstance(value, (str, bytes)):
            return True
        else:
            what = f"a {type(value).__name__}"
        self._refuse(name, (
            f"the metric {name!r} at step {self.step if step is None else step} is {what}, not one number. "
            f"Log a number per name (reduce it, or return its scalars under keys of their own), or leave it "
            f"out of what the {self.events['metrics']!r} join point returns"))
        return False

    def _refuse(self, name: str, why: str) -> None:
        """A value that cannot be logged: left out, said once per name (a warning)."""
        refused = self.__dict__.setdefault("_refused", set())  # (a logger pickled before it had one)
        if name in refused:
            return
        refused.add(name)
        warnings.warn(f"MetricsLogger: {why}. It is left out (this once said; the other values are logged).",
                      HookwrapWarning, stacklevel=3)

    def end_of_epoch(self, obj: Any = None) -> None:
        self._log_update()
        shared().read()  # what is queued (CUDA: the copies done by now)
        self.flush()

    def flush(self, obj: Any = None) -> None:
        """Send the rows whose values have been read (in order: up to the first
        still waiting for the device)."""
        self._send(self._take(), raise_errors=True)

    def close(self, obj: Any = None) -> None:
        """Send what is pending (waiting for values still on the device), then
        ``finalize("success")`` each logger (the built-in ones close their files; a
        later row reopens them)."""
        self._finish("success", None)

    def settle(self, obj: Any, ending: Ending) -> None:
        """A boundary (``hookwrap.extend.Defers``): every row sent; at the end of the
        run, the loggers finalized (``"failed"`` when an error is leaving it)."""
        if not is_rank_zero():
            return
        self._log_update()
        failure = ending.exception if ending.failed else None
        if ending.run_ended and self._reads_rows and self.step and not self._training_rows and not self._warned:
            self._warned = True
            warnings.warn(
                f"MetricsLogger: {type(obj).__qualname__} logged no training values in this run ({self.step} "
                f"steps), so this logger, which logs the framework's own rows, has none: set the framework's "
                f"logging (HF TrainingArguments(logging_steps=...), not logging_strategy='no'; Lightning "
                f"self.log(...) in training_step, log_every_n_steps), or pass loss_event='loss' to log each "
                f"loss call.", HookwrapWarning, stacklevel=2)
        if ending.run_ended:
            if failure is None and obj is not None and not is_distributed():
                # Before a "success": a guard that deferred a decision on this run takes it
                # now (a NaN fails the run for every logger, whatever the attach order;
                # its error then reaches the run's error callbacks, and "failed"). Not
                # under torch.distributed: a collective, and only rank 0 gets here.
                settle_decisions(obj)
            self._finish("failed" if failure is not None else "success", failure)
            return
        self.read_back()
        errors = self._send(self._take(), raise_errors=False)
        if errors and failure is None:
            _raise(errors)
        for exc in errors:
            failure.add_note(f"MetricsLogger: {type(exc).__name__}: {exc}")  # type: ignore[union-attr]

    def pending(self) -> str:
        return f"{len(self.rows)} metric rows" if self.rows else ""

    def read(self) -> list[tuple[int, str, float]]:
        """The rows logged so far, parsed back from the CSV file (waits for values
        still on the device)."""
        if self.csv is None:
            raise HookError("MetricsLogger.read() parses the CSV file, and this logger has none "
                            "(path=None): read what your loggers wrote, or pass path=.")
        self.read_back()
        self.flush()
        return self.csv.read()

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "losses": self.losses}
        if self.csv is not None and is_rank_zero():  # what was logged up to now, written: where a resume cuts
            self.read_back()
            self.flush()
            state["csv_bytes"] = self.csv.size() or 0
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.losses = state["losses"]
        if self.csv is not None and isinstance(state.get("csv_bytes"), int):
            self.csv.resume_at(state["csv_bytes"])
        if self.tensorboard is not None:
            self.tensorboard.resume()

    def redo_from_resumed_step(self) -> None:
        """After ``load_state_dict``: the resumed run logs everything from the step it
        resumed at again, rows written before the state was saved included (``hookwrap
        run`` replaying a script to the step of a Checkpoint saved on an exception,
        after that step's loss was logged), so every CSV row of that step or later is
        moved aside at the first row logged."""
        if self.csv is not None and is_rank_zero():
            self.csv.resume_at(0)

    def __getstate__(self) -> dict[str, Any]:
        self.read_back()
        self.flush()  # the rows go from here, not from the copy (nothing left to read back then)
        # A module logger (mlflow) pickles by name: modules do not pickle.
        return {**super().__getstate__(), "loggers": [_ModuleByName(s.__name__) if isinstance(s, types.ModuleType)
                                                      else s for s in self.loggers]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["loggers"] = [importlib.import_module(s.name) if isinstance(s, _ModuleByName) else s
                            for s in state["loggers"]]
        super().__setstate__(state)

    # --- internals -----------------------------------------------------------------

    def waits_for_read_back(self) -> bool:
        """A row whose value is still on the device (``QueuesReadBacks``)."""
        return any(row[2] is None for row in self.rows)

    def _take(self, keep_step: int | None = None) -> list[list[Any]]:
        """The rows read, from the first up to one still on the device (or, with
        ``keep_step``, of that step: its other values may follow)."""
        ready = 0
        while ready < len(self.rows) and self.rows[ready][2] is not None \
                and self.rows[ready][0] != keep_step:
            ready += 1
        rows, self.rows = self.rows[:ready], self.rows[ready:]
        return rows

    def _send(self, rows: list[list[Any]], raise_errors: bool) -> list[BaseException]:
        """Each logger's ``log_metrics`` per step of ``rows``, then its ``save()``. A
        logger that raises misses the rest; the exceptions, noted, are raised (the
        first, after every logger had its batch) or returned."""
        if not rows:
            return []
        self._unfinished = True  # rows sent since the loggers were last finalized
        batches = _by_step(rows)
        errors: list[BaseException] = []
        for sink in self.sinks:
            for i, (step, metrics) in enumerate(batches):
                try:
                    sink.log_metrics(metrics.copy(), step)
                except Exception as exc:
                    missed = sorted({s for s, _ in batches[i:]})
                    steps = f"step {missed[0]}" if len(missed) == 1 else f"steps {missed[0]}-{missed[-1]}"
                    exc.add_note(f"MetricsLogger: {_name(sink)}.log_metrics raised at step {step}; it missed "
                                 f"the values of {steps}, which the other loggers got.")
                    errors.append(exc)
                    break
            else:
                self._call(sink, "save", (), errors)
        if errors and raise_errors:
            _raise(errors)
        return errors

    def _finish(self, status: str, failure: BaseException | None) -> None:
        self.read_back()
        errors = self._send(self._take(), raise_errors=False)
        if not self.__dict__.pop("_unfinished", False) and not errors:
            return  # nothing sent since the last finalize (a script's end after fit's)
        for sink in self.sinks:
            if not self._call(sink, "finalize", (status,), errors):
                self._call(sink, "save", (), errors)
        if not errors:
            return
        if failure is None:
            _raise(errors)
        for exc in errors:  # the fit's own error goes on; these are noted on it
            notes = getattr(exc, "__notes__", [])
            failure.add_note(f"{notes[-1] if notes else 'MetricsLogger:'} ({type(exc).__name__}: {exc})")

    @staticmethod
    def _call(sink: Any, method: str, args: tuple[Any, ...], errors: list[BaseException]) -> bool:
        """``sink.method(*args)`` where it has that method; False where it has not."""
        call = getattr(sink, method, None)
        if not callable(call):
            return False
        try:
            call(*args)
        except Exception as exc:
            exc.add_note(f"MetricsLogger: {_name(sink)}.{method}({', '.join(map(repr, args))}) raised.")
            errors.append(exc)
        return True


class _ModuleByName(NamedTuple):
    name: str


def _by_step(rows: list[list[Any]]) -> list[tuple[int, dict[str, float]]]:
    """``rows`` as ``(step, {name: value})`` in step order (stable): one dict per
    step and group (an evaluation's), and another for a name already in that dict."""
    steps: dict[int, list[tuple[int, dict[str, float]]]] = {}
    for step, name, value, *group in rows:
        of = group[0] if group else 0  # (a row held by a logger pickled before groups)
        dicts = steps.setdefault(step, [(of, {})])
        if name in dicts[-1][1] or dicts[-1][0] != of:
            dicts.append((of, {}))
        dicts[-1][1][name] = value
    return [(step, metrics) for step in sorted(steps) for _, metrics in steps[step]]


def _raise(errors: list[BaseException]) -> NoReturn:
    first = errors[0]
    for other in errors[1:]:
        first.add_note(f"MetricsLogger: also {type(other).__name__}: {other}"
                       + "".join(f"; {note}" for note in getattr(other, "__notes__", [])))
    raise first


def _name(sink: Any) -> str:
    """A logger as errors name it: a module by its name, an object by its class."""
    if isinstance(sink, types.ModuleType):
        return sink.__name__
    return type(sink).__name__


def _check_loggers(loggers: Any) -> list[Any]:
    """``loggers`` as a list, each checked to have a callable ``log_metrics``."""
    if hasattr(loggers, "log_metrics") or isinstance(loggers, logging.Logger) or _is_wandb(loggers):  # one, not a list
        loggers = [loggers]
    elif isinstance(loggers, (str, bytes, os.PathLike)) or not isinstance(loggers, Iterable):
        raise SettingError(f"MetricsLogger: loggers must be a list of loggers (objects with "
                           f"log_metrics(metrics, step)), got {_name(loggers)} {loggers!r}.")
    checked = [LogRecords(logger) if isinstance(logger, logging.Logger) else
               WandbRun(logger) if _is_wandb(logger) else logger for logger in loggers]
    for i, logger in enumerate(checked):
        method = getattr(logger, "log_metrics", None)
        if isinstance(logger, type):
            raise HookError(f"MetricsLogger: loggers[{i}] is the class {logger.__qualname__}, not a logger: "
                            f"pass an instance, {logger.__qualname__}(...).")
        if callable(method):
            continue
        what = "has no log_metrics method" if method is None else \
            f"has a log_metrics that is not callable (a {type(method).__name__})"
        fix = " For a file of hookwrap's own, pass path= instead." if isinstance(logger, (str, os.PathLike)) else ""
        raise HookError(
            f"MetricsLogger: loggers[{i}], {logger!r} ({_name(logger)}), {what}. A logger is an object "
            f"with log_metrics(metrics: dict[str, float], step: int), as Lightning's loggers (CSVLogger, "
            f"TensorBoardLogger, WandbLogger, MLFlowLogger, ...) and the mlflow module have: wrap "
            f"yours in a class that has one.{fix}")
    return checked


def _fill(row: list[Any], values: list[float]) -> None:
    row[2] = values[0]


def _is_scalar(value: Any) -> bool:
    """A Python number, or a tensor of one element: a loss that sums."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    numel = getattr(value, "numel", None)
    return callable(numel) and numel() == 1

