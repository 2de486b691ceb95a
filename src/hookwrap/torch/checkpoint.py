"""``BestCheckpoint`` and ``Checkpoint``: when to save, what, which files to keep, and
how to resume. Every file is written, read, found and removed through a
``CheckpointIO`` (:mod:`hookwrap.torch.checkpoint_io`), which also holds the RNG
states and their gathering across ranks."""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
import threading
import time
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Literal, overload

from ..errors import HookError, HookwrapWarning, SettingError, add_note_once
from .. import callback_state, load_callback_state
from ..extend import JoinPointInfo, anchored, is_join_point, per_join_point, reader, runs_last, stateful_callbacks
from ._attach import (COUNT, NUMBER_OR_NONE, CountingCallback, DefaultEvent, Saved, framework_resume, from_object,
                      is_rank_zero, is_reference, positive_number, saved, whole_number)
from ._best import MonitoredCallback
from .checkpoint_io import (CheckpointIO, RemotePath, StoragePath, gather_ranks, of_this_rank, portable_rng,
                            rng_state, set_rng_state, storage_path)
from ._signals import Caught, signal_numbers
from .distributed import any_rank, is_distributed, per_rank, written_on_rank_zero
from .readback import settle

_clock = time.monotonic  # every_n_minutes' clock (a test sets its own)

log = logging.getLogger(__name__)  # under "hookwrap": saves, restores and resumes, at INFO

__all__ = ["BestCheckpoint", "Checkpoint", "rng_state", "set_rng_state"]


class BestCheckpoint(MonitoredCallback):
    """Saves ``{"model": ..., "optimizer": ..., monitor, value, step}`` with
    ``torch.save`` each time ``monitor`` (read from join point ``event`` as
    EarlyStopping reads it) improves on the best so far.

    The file is written atomically: to a temporary file in the same folder, then
    renamed over ``path``, so a crash mid-write never leaves a torn checkpoint.
    ``model`` and ``optimizer`` are read where the join point has them: its
    argument of that name (a script's ``test(model, device, loader)``), else that
    attribute of the hooked object, or they are the objects themselves
    (``optimizer=None`` saves the model only). With ``restore_best=True`` the best
    weights are loaded back into the model after ``fit_event`` returns (read the
    same way from that join point); a run that saved none (``monitor`` NaN at every
    evaluation) restores nothing, with a ``HookwrapWarning``, and never loads a file
    an earlier run left at ``path``.

    Under torch.distributed ``monitor`` is the mean over the ranks (one all-reduce
    per evaluation), so every rank agrees on "improved"; rank 0 alone writes, then
    every rank waits for the write (an all-reduce of "did it fail", the barrier: no
    rank reads a half-written file, and a failed write stops every rank). The
    restore loads the file on each rank onto the device of the model's parameters
    (``map_location``); ``path`` must be on a filesystem every rank sees.

    A ``path`` ending in ``.safetensors`` is written with ``safetensors``
    (``save_model``: the weights alone, shared tensors once, the monitor, value and
    step as its metadata), for HF users: beside the model's ``config.json`` it is
    what ``from_pretrained`` loads. It holds no optimizer (``optimizer`` must be left
    as it is, or None), and it is a local file.
    """

    def __init__(self, path: str | os.PathLike[str], monitor: str = "val_loss", mode: str = "min",
                 event: str = "evaluate", model: Any = "model", optimizer: Any = "optimizer",
                 restore_best: bool = False, min_delta: float = 0.0, fit_event: str = "fit",
                 step_event: str | None = DefaultEvent("step")) -> None:
        where = f"BestCheckpoint({os.fspath(path)!r})"
        self.path = storage_path(path, where)
        self.io = CheckpointIO()  # the files: written, read and found through it
        self.safetensors = os.fspath(path).endswith(".safetensors")
        if self.safetensors:
            if isinstance(self.path, RemotePath):
                raise SettingError(f"{where}: a .safetensors file is written on this machine's disk: give a "
                                   f"local path, or a .pt file for a URL.")
            if optimizer is not None and optimizer != "optimizer":
                raise SettingError(f"{where}: a .safetensors file holds the weights alone, and optimizer= names one "
                                   f"to save: pass optimizer=None, or a .pt path to keep both.")
            optimizer = None
            try:
                import safetensors.torch  # noqa: F401
            except ImportError:
                raise ImportError(f"{where}: writing .safetensors needs the safetensors package: pip install "
                                  f"safetensors (HF's transformers installs it), or give a .pt path.") from None
        self.model, self.optimizer = model, optimizer
        self.restore_best, self.fit_event = restore_best, fit_event
        self.saved = 0
        self._evaluations = 0  # values of monitor read in this run (finite or not)
        # The model and optimizer of the call in progress, per event: taken before
        # the call (argument or attribute), used after it, then let go.
        self._held: dict[tuple[str, str], Any] = {}
        super().__init__(monitor, mode, min_delta, event, step_event)

    stored_at = "path"

    def attach(self, target: type | None) -> list[tuple[str, Callable[..., Any]]]:
        pairs = self._holders(self.event) + super().attach(target)
        if self.restore_best and self.wants(target, self.fit_event):
            pairs += self._holders(self.fit_event)
            pairs.append((f"post-{self.fit_event}", reader(self._restore, "post-")))
        return pairs

    def _holders(self, event: str) -> list[tuple[str, Callable[..., Any]]]:
        wanted = [("model", self.model)] + ([("optimizer", self.optimizer)] if self.optimizer is not None else [])
        return [(f"pre-{event}", self.value_reader(self._hold, "pre-", setting, what, (event, what)))
                for what, setting in wanted]

    def _hold(self, obj: Any, event: str, what: str, value: Any) -> None:
        self._held[event, what] = value

    def _release(self, event: str) -> tuple[Any, Any]:
        return self._held.pop((event, "model"), None), self._held.pop((event, "optimizer"), None)

    def observe(self, obj: Any, value: Any) -> None:
        self._evaluations += 1
        try:
            super().observe(obj, value)
        finally:
            self._release(self.event)

    def improved(self, obj: Any, value: float) -> None:
        with written_on_rank_zero(self.where, f"the checkpoint at step {self.step}"):
            if is_rank_zero():
                model, optimizer = self._held.get((self.event, "model")), self._held.get((self.event, "optimizer"))
                self.save(obj, value, model, optimizer)

    def save(self, obj: Any, value: float, model: Any = None, optimizer: Any = None) -> None:
        """Write the checkpoint: ``model`` and ``optimizer`` given, else read from ``obj``."""
        if model is None:
            model = from_object(obj, self.model, "model", self.where)
        if self.safetensors:
            self._save_safetensors(model, value)
            return
        checkpoint = {"model": model.state_dict(), "monitor": self.monitor, "value": value,
                      "step": self.step}
        if self.optimizer is not None:
            if optimizer is None:
                optimizer = from_object(obj, self.optimizer, "optimizer", self.where)
            checkpoint["optimizer"] = optimizer.state_dict()
        self.io.save(checkpoint, self.path)
        self.saved += 1
        log.info("%s: saved the best %s so far, %.6g, at step %d", self.where, self.monitor, value, self.step)

    def _save_safetensors(self, model: Any, value: float) -> None:
        """The weights with ``safetensors.torch.save_model``, atomically, as every
        checkpoint file is written (``CheckpointIO.replace_atomically``)."""
        import safetensors.torch

        path = Path(str(self.path))  # a local file (a URL is refused when made)
        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {"format": "pt",  # as save_pretrained writes it
                    "monitor": str(self.monitor), "value": repr(value), "step": str(self.step)}
        self.io.replace_atomically(path, lambda tmp: safetensors.torch.save_model(model, str(tmp), metadata=metadata))
        self.saved += 1
        log.info("%s: saved the best %s so far, %.6g, at step %d", self.where, self.monitor, value, self.step)

    def _restore(self, obj: Any) -> None:
        model, optimizer = self._release(self.fit_event)
        self.load_best(obj, model, optimizer)

    def load_best(self, obj: Any, model: Any = None, optimizer: Any = None) -> None:
        """Load the best weights saved so far into the model (and optimizer):
        ``model`` and ``optimizer`` given, else read from ``obj``. Onto the device of
        the model's parameters; under torch.distributed on every rank. Only a best of
        this run (or of the state it resumed): when it saved none (``monitor`` never
        finite) nothing is loaded, and a ``HookwrapWarning`` says why."""
        if self.best.value is None:
            # This run saved nothing: a file at path is an earlier run's (another model's
            # best, or this one's under other settings), not a best of this run.
            if self._evaluations:
                why = (f"{self.monitor} had no finite value at any of its {self._evaluations} "
                       f"evaluation(s) ({self.event!r}), so none was saved")
            else:
                why = f"{self.event!r} never ran, so no value of {self.monitor} was seen"
            warnings.warn(f"{self.where}: restore_best restored nothing: {why}. The model keeps the "
                          f"weights it ended with; {str(self.path)!r} was not read.",
                          HookwrapWarning, stacklevel=2)
            return
        if not self.io.exists_on_every_rank(self.path, self.where):
            return  # saved, then removed by someone else: nothing to load
        if model is None:
            model = from_object(obj, self.model, "model", self.where)
        if self.safetensors:  # tensors alone: nothing in the file can run code
            import safetensors.torch

            safetensors.torch.load_model(model, str(self.path), device=str(_device_of(model)))
            log.info("%s: restored the best weights from %s", self.where, self.path)
            return
        checkpoint = self.io.load(self.path, map_location=_device_of(model))
        model.load_state_dict(checkpoint["model"])
        if self.optimizer is not None and "optimizer" in checkpoint:
            if optimizer is None:
                optimizer = from_object(obj, self.optimizer, "optimizer", self.where)
            optimizer.load_state_dict(checkpoint["optimizer"])
        log.info("%s: restored the best weights (%s %.6g, step %s)", self.where, self.monitor,
                 checkpoint.get("value", float("nan")), checkpoint.get("step"))


def _is_fsdp(model: Any) -> bool:
    """Is ``model`` wrapped by FSDP (2: ``fully_shard``, or 1)? Only asked where torch.distributed is."""
    import sys

    if "torch.distributed.fsdp" not in sys.modules:
        return False  # never imported: nothing is wrapped by it
    from torch.distributed import fsdp

    kinds = tuple(kind for kind in (getattr(fsdp, "FSDPModule", None), getattr(fsdp, "FullyShardedDataParallel", None))
                  if isinstance(kind, type))
    return bool(kinds) and isinstance(model, kinds)


def _device_of(model: Any) -> Any:
    """Where the model's parameters live (the first one's device), else the CPU."""
    import torch

    parameters = getattr(model, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    return first.device if first is not None else torch.device("cpu")


class DefaultName(str):
    """A default attribute name: read when the object has it (and it is not None),
    skipped when it does not. A name the user passes explicitly must exist."""

    __slots__ = ()


_NOT_GIVEN: Any = object()
_NAMED = ("last", "best", "exception", "signal", "None")  # resume's names, not files


class Checkpoint(MonitoredCallback):
    """Saves everything a run needs to continue where it was, and resumes it.

    Files in ``dir`` (each written atomically: a temporary file in ``dir``, then
    ``os.replace``), all holding the same complete state:

    * ``last.pt`` (``save_last=True``): at the end of every epoch, with every
      ``every_n_steps`` file, and at the end of ``fit``;
    * ``step=N.pt`` every ``every_n_steps`` steps, and after the first step that ends
      ``every_n_minutes`` or more after the last timed save (or the run's start;
      Lightning's ``train_time_interval``), ``epoch=N.pt`` every ``every_n_epochs``
      epochs, all kept;
    * ``best-epoch=E-step=N.pt``: the ``save_top_k`` best by ``monitor`` (read from join
      point ``event`` as EarlyStopping reads it; the mean over the ranks under
      torch.distributed), the others deleted; ``best-epoch=E-step=N-v1.pt``, ``-v2``,
      ... for more evaluations at the same step.

    Each holds the ``state_dict()`` of ``model``, ``optimizer`` and ``scheduler``,
    the steps and epochs completed, the RNG states (``random``, NumPy's global one
    when NumPy is imported, torch's CPU and every CUDA device's, and each
    ``torch.Generator`` in ``generators``, such as a DataLoader's ``generator=``;
    one set per rank under torch.distributed) and ``hookwrap.callback_state`` of the hooked object
    (EarlyStopping's patience count and best value, this callback's own top-k).

    A save decided by an evaluation (top-k) or a step (``every_n_steps``) is written
    at the end of that call, after every other callback of it whatever tier
    (``_registry.runs_last``): the file holds the weights of that evaluation or step
    and every callback's decision on it. One decided at the end of an epoch is
    written at the next boundary of the loop (the start of the next step or epoch,
    the end of ``fit``) or with the next evaluation's file, so that it holds the
    evaluation that follows the epoch. ``step`` and ``epoch`` in the file are those
    completed when it was written. A write that fails raises and leaves ``top_k``
    and the folder as they were (the new files half-made deleted); the next save
    also deletes temporary files a killed write left (``CheckpointIO.save``).

    Every file is read with ``torch.load(weights_only=True)``: tensors and plain
    data, never code; the top-k names in ``last.pt`` must be files of ``dir``.

    ``model``, ``optimizer`` and ``scheduler`` are read where the loop has them:
    the argument of that name of the ``fit`` or ``epoch`` join point, else that
    attribute of the hooked object, or they are the objects themselves.
    ``optimizer=None`` and ``scheduler=None`` leave them out; the default
    ``scheduler="scheduler"`` is skipped when the object has none.

    ``resume(target)`` (or ``resume_from=`` at the start of ``fit``) loads a file
    back into all of them; see its docstring. Under torch.distributed rank 0
    writes and every rank waits for the write; every rank restores, onto its
    model's device.

    Surviving what ends a run (docs/guide/resuming.md):

    * ``on_exception=True``: when ``fit`` raises, ``exception.pt`` (and ``last.pt``)
      holds the run after its last completed step, then the exception goes on;
    * ``on_signal=(signal.SIGTERM,)``: a handler that only notes the signal while
      ``fit`` runs; after the step in progress, ``signal.pt`` (and ``last.pt``), then
      the signal is handed on (the previous Python handler, else
      ``SystemExit(128 + signum)``);
    * ``dir`` may be a URL (``s3://``, ``memory://``) opened with fsspec;
    * an FSDP-wrapped model (or any, with ``sharded=True``) is saved in shards by
      ``torch.distributed.checkpoint``: each checkpoint a folder of that name;
    * ``async_write=True``: the state is taken (copied to the host) when the save is
      due, and its files are written by a background thread, one write in flight
      (the next save waits for it; Lightning's ``AsyncCheckpointIO``). A failed write
      is raised at the next step or save, top-k and the folder as at the last write;
      the end of ``fit``, a signal's or an exception's save and ``resume`` wait for it.
      Under torch.distributed and for shards the write stays in the training thread.
    """

    def __init__(self, dir: str | os.PathLike[str], monitor: str | None = None, mode: str = "min",
                 save_top_k: int = 1, every_n_steps: int | None = None,
                 every_n_epochs: int | None = None, save_last: bool = True, min_delta: float = 0.0,
                 model: Any = "model", optimizer: Any = "optimizer",
                 scheduler: Any = DefaultName("scheduler"), generators: Any = (),
                 resume_from: str | os.PathLike[str] | None = None,
                 event: str = DefaultEvent("evaluate"), epoch_event: str | None = DefaultEvent("epoch"),
                 fit_event: str | None = DefaultEvent("fit"),
                 step_event: str | None = DefaultEvent("step"), on_exception: bool = False,
                 on_signal: Any = None, sharded: bool | None = None,
                 every_n_minutes: float | None = None, async_write: bool = False) -> None:
        where = f"Checkpoint({str(dir)!r})"
        if not isinstance(dir, (str, os.PathLike)) or not str(dir):
            raise SettingError(f"{where}: dir must be a folder path, got {dir!r}.")
        if monitor is not None and not (isinstance(monitor, str) and monitor):
            raise SettingError(f"{where}: monitor must be the name of a value, or None, got {monitor!r}.")
        self.dir = storage_path(dir, where)
        self.io = CheckpointIO()  # the files: written, read, found and removed through it
        self.save_top_k = whole_number(save_top_k, "save_top_k", where)
        self.every_n_steps = None if every_n_steps is None else whole_number(every_n_steps, "every_n_steps", where)
        self.every_n_epochs = None if every_n_epochs is None else whole_number(every_n_epochs, "every_n_epochs", where)
        self.every_n_minutes = None if every_n_minutes is None else \
            positive_number(every_n_minutes, "every_n_minutes", where, why="the wall-clock time between saves")
        self._timed_from: float | None = None  # when the time to the next timed save started
        if not isinstance(save_last, bool):
            raise SettingError(f"{where}: save_last must be True or False, got {save_last!r}.")
        if not isinstance(on_exception, bool):
            raise SettingError(f"{where}: on_exception must be True or False, got {on_exception!r}.")
        if not isinstance(async_write, bool):
            raise SettingError(f"{where}: async_write must be True or False, got {async_write!r}.")
        self.async_write = async_write
        self._in_flight: _Write | None = None  # async_write: the files being written in the background
        self.on_exception = on_exception
        if sharded is not None and not isinstance(sharded, bool):
            raise SettingError(f"{where}: sharded must be True, False or None (sharded when the model is "
                               f"FSDP-wrapped), got {sharded!r}.")
        self.sharded = sharded
        self.on_signal = None if on_signal is None else signal_numbers(on_signal, where)
        self._caught = None if self.on_signal is None else Caught(self.on_signal, where)
        if resume_from is not None and not isinstance(resume_from, (str, os.PathLike)):
            raise SettingError(f"{where}: resume_from must be 'last', 'best' or a file path, got {resume_from!r}.")
        if monitor is None and save_top_k != 1:
            raise SettingError(f"{where}: save_top_k={save_top_k} keeps the best files by a monitored value: "
                               f"pass monitor= too.")
        try:
            self.generators = list(generators)
        except TypeError:
            raise SettingError(f"{where}: generators must be a list of torch.Generator, got {generators!r}.") from None
        for generator in self.generators:
            if not (callable(getattr(generator, "get_state", None)) and callable(getattr(generator, "set_state", None))):
                raise SettingError(f"{where}: generators must be a list of torch.Generator (a DataLoader's "
                                   f"generator=), got {generator!r} in it.")
        self.save_last = save_last
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        # A file named on hookwrap run's command line: in the folder it ran in (_paths).
        self.resume_from = resume_from if str(resume_from) in _NAMED else anchored(resume_from)
        self.epoch_event, self.fit_event = epoch_event, fit_event
        self.epoch = 0  # epochs completed
        self.saved = 0  # files written by this process (rank 0 under torch.distributed)
        self.top_k: list[tuple[float, int, str]] = []  # (value, step, file name), best first
        self._pending: set[str] = set()  # file names to write at the end of the call, or the next boundary
        self._evicted: list[str] = []  # top-k files to delete after the next write
        self._kept: list[tuple[float, int, str]] = []  # top_k as the folder holds it: at the last write
        self._held: dict[str, Any] = {}  # model/optimizer/scheduler read at pre-fit/pre-epoch
        self._target: Any = None
        self._defer = True  # an epoch's save at the next boundary; at once on a target without fit
        # on_exception: the steps completed (whose post-step ran) and the RNG states then,
        # the state a save on an exception holds (the step that raised never completed).
        self._completed = 0
        self._rng_completed: dict[str, Any] | None = None
        self._interrupted = False  # saved on a signal or an exception in this fit already
        self._counts_completed = False  # a post-step keeps _completed (on_exception, on_signal)
        # hookwrap run, where the script is the run (no object to read them from): the
        # state of the run's callbacks, which every file holds and a resume gives back
        # (state() and load(state, strict, where)).
        self.run_state: Any = None
        super().__init__(monitor or "", mode, min_delta, event, step_event)
        self.monitor: str | None = monitor  # type: ignore[assignment]

    stored_at = "dir"

    def state_place(self) -> str:
        # One spelling of the folder (a URL is one already).
        return str(self.dir if isinstance(self.dir, RemotePath) else os.path.abspath(self.dir))

    @property
    def last_path(self) -> StoragePath:
        return self.dir / "last.pt"

    @property
    def best_path(self) -> StoragePath | None:
        """The best of the top-k files, or None before any."""
        return self.dir / self.top_k[0][2] if self.top_k else None

    # --- attaching ------------------------------------------------------------------

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        self._refuse_framework_resume(target)
        self._target = None if isinstance(target, type) else target
        pairs: list[tuple[str, Callable[..., Any]]] = []
        if self.monitor is not None:
            pairs += super().attach(target)
            pairs.append((f"post-{self.event}", self._writer()))
        elif not isinstance(self.event, DefaultEvent):
            self.wants(target, self.event)
        wants_fit = self.wants(target, self.fit_event)
        self._defer = wants_fit
        if wants_fit:
            assert self.fit_event is not None
            pairs += self._holders(self.fit_event)
            if self.resume_from is not None:
                pairs.append((f"pre-{self.fit_event}", reader(self._resume_at_fit, "pre-")))
        if self.wants(target, self.epoch_event):
            assert self.epoch_event is not None
            pairs += self._holders(self.epoch_event)
            pairs.append((f"pre-{self.epoch_event}", reader(self._boundary, "pre-")))
            pairs.append((f"post-{self.epoch_event}", reader(self._epoch_ended, "post-")))
        for setting in ("every_n_steps", "every_n_minutes"):
            if getattr(self, setting) is not None and not self.wants(target, self.step_event):
                raise HookError(f"{self.where}: {setting} saves after a step, and the target has no "
                                f"{self.step_event!r}. Pass step_event= the join point of one step.")
        if self.async_write and not wants_fit:
            raise HookError(f"{self.where}: async_write commits (or raises) its last background write when fit "
                            f"ends, and the target has no {self.fit_event!r}: a failure there would go unheard. "
                            f"Pass fit_event= the join point of the run, or leave async_write off.")
        if self.resume_from is not None and not wants_fit:
            raise HookError(f"{self.where}: resume_from restores at the start of fit, and the target has "
                            f"no {self.fit_event!r}. Pass fit_event=, or call checkpoint.resume(obj).")
        if wants_fit:
            pairs.append((f"pre-{self.fit_event}", reader(self._fit_started, "pre-")))
            pairs.append((f"post-{self.fit_event}", reader(self._fit_ended, "post-")))
            pairs.append((f"error-{self.fit_event}", reader(self._fit_failed, "error-", "exception")))
        self._counts_completed = (self.on_exception or self.on_signal is not None) \
            and self.wants(target, self.step_event)
        if self.on_signal is not None and not (wants_fit and self._counts_completed):
            raise HookError(f"{self.where}: on_signal installs its handlers when fit starts and saves after "
                            f"a step; the target lacks {self.fit_event!r} or {self.step_event!r}. Pass "
                            f"fit_event= and step_event= the join points of the run and of one step.")
        if self.on_exception and not wants_fit:
            if not self._counts_completed:
                raise HookError(f"{self.where}: on_exception saves when the run raises, and the target has "
                                f"neither {self.fit_event!r} nor {self.step_event!r}. Pass fit_event= or "
                                f"step_event=.")
            pairs.append((f"error-{self.step_event}", reader(self._fit_failed, "error-", "exception")))
        return pairs

    def _holders(self, event: str) -> list[tuple[str, Callable[..., Any]]]:
        pairs = []
        for what in ("model", "optimizer", "scheduler"):
            setting = getattr(self, what)
            if setting is None or is_reference(setting):
                continue  # "__main__:model": looked up when saving (the script may make it after fit starts)
            if isinstance(setting, DefaultName):  # an argument if there is one, else read when saving
                choose = functools.partial(self._choose_default, setting, what)
                pairs.append((f"pre-{event}", per_join_point(self, "_hold", choose)))
                continue
            pairs.append((f"pre-{event}", self.value_reader(self._hold, "pre-", setting, what, (what,))))
        return pairs

    def _choose_default(self, setting: str, what: str, jp: JoinPointInfo) -> Any:
        if setting in jp.arguments:
            return reader(self._hold, "pre-", setting, (what,))
        return reader(self._ignore, "pre-")

    def _ignore(self, obj: Any) -> None:
        pass

    def _hold(self, obj: Any, what: str, value: Any) -> None:
        self._held[what] = value

    def _objects(self, obj: Any, model: Any = _NOT_GIVEN, optimizer: Any = _NOT_GIVEN,
                 scheduler: Any = _NOT_GIVEN) -> dict[str, Any]:
        """The model, optimizer and scheduler to save or restore: given, else held
        from the join point, else read from ``obj``; None where left out."""
        given = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
        found: dict[str, Any] = {}
        for what, value in given.items():
            setting = getattr(self, what)
            if value is not _NOT_GIVEN:
                found[what] = value
            elif setting is None:
                found[what] = None
            elif what in self._held:
                found[what] = self._held[what]
            elif isinstance(setting, DefaultName):
                found[what] = getattr(obj, setting, None) if obj is not None else None
            else:
                found[what] = from_object(obj, setting, what, self.where)
        return found

    # --- deciding what to save --------------------------------------------------------

    def _writer(self) -> Callable[..., Any]:
        """After every other callback of the call that made a save due (an evaluation,
        the N-th step), whatever tier: the file holds the state of that moment, with
        every callback's decision on it (EarlyStopping's count, a StopTraining)."""
        return runs_last(reader(self._boundary, "post-"))

    def _count_step(self, obj: Any) -> None:
        if self._pending:
            self._write(obj)
        self.step += 1

    def event_methods(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        pairs = super().event_methods(target)
        if (self.every_n_steps is not None or self.every_n_minutes is not None) \
                and self.wants(target, self.step_event):
            pairs.append((f"post-{self.step_event}", reader(self._step_ended, "post-")))
            pairs.append((f"post-{self.step_event}", self._writer()))
        if self._counts_completed:
            pairs.append((f"post-{self.step_event}", reader(self._step_completed, "post-")))
        if self.async_write and self.wants(target, self.step_event):
            pairs.append((f"pre-{self.step_event}", reader(self._written_by_now, "pre-")))
        return pairs

    def _written_by_now(self, obj: Any) -> None:
        """Each step: a background write that has ended is committed, or its error
        raised here; one still running is left to run."""
        if self._in_flight is not None and not self._in_flight.thread.is_alive():
            self.wait_for_write()

    def _step_ended(self, obj: Any) -> None:
        due = self.every_n_steps is not None and self.step % self.every_n_steps == 0
        if self.every_n_minutes is not None:
            now = _clock()
            if self._timed_from is None:  # the first step: the time counts from its end
                self._timed_from = now
            elapsed = now - self._timed_from >= 60.0 * self.every_n_minutes
            if is_distributed():  # the ranks' clocks differ: one decision for all
                elapsed = any_rank(elapsed)
            if elapsed:
                self._timed_from = now
                due = True
        if due:  # written at the end of this call (_writer)
            self._pending.add(f"step={self.step}.pt")
            if self.save_last:
                self._pending.add("last.pt")

    def _epoch_ended(self, obj: Any) -> None:
        self.epoch += 1
        if self.every_n_epochs is not None and self.epoch % self.every_n_epochs == 0:
            self._pending.add(f"epoch={self.epoch}.pt")
        if self.save_last:
            self._pending.add("last.pt")
        self._due(obj)

    def improved(self, obj: Any, value: float) -> None:
        self._rank(value)  # written at the end of this call (_writer)

    def not_improved(self, obj: Any, value: float) -> None:
        self._rank(value)

    def _due(self, obj: Any) -> None:
        """Without a fit join point no later boundary is sure to come: write now."""
        if not self._defer and self._pending:
            self._write(obj)

    def _rank(self, value: float) -> None:
        """Keep ``value`` among the top k when it beats the worst kept (NaN never does)."""
        if math.isnan(value):
            return
        if len(self.top_k) >= self.save_top_k:
            worst = self.top_k[-1][0]
            if not (value < worst if self.best.mode == "min" else value > worst):
                return
        name = self._free_name(f"best-epoch={self.epoch}-step={self.step}")
        self.top_k.append((value, self.step, name))
        self.top_k.sort(key=lambda entry: entry[0], reverse=self.best.mode == "max")
        for _, _, dropped in self.top_k[self.save_top_k:]:
            if dropped in self._pending:
                self._pending.discard(dropped)  # never written
            else:
                self._evicted.append(dropped)
        del self.top_k[self.save_top_k:]
        self._pending.add(name)

    def _free_name(self, stem: str) -> str:
        """``stem.pt``, or ``stem-v1.pt``, ``stem-v2.pt``, ... when a kept, pending or
        evicted file already has the name: several evaluations at one step are each
        their own file (one name would be overwritten by the later, worse or not)."""
        taken = {entry[2] for entry in self.top_k} | self._pending | set(self._evicted)
        name, version = f"{stem}.pt", 0
        while name in taken:
            version += 1
            name = f"{stem}-v{version}.pt"
        return name

    def _boundary(self, obj: Any) -> None:
        if self._pending:
            self._write(obj)

    def _fit_ended(self, obj: Any) -> None:
        try:
            if self.save_last:
                self._pending.add("last.pt")
            if self._pending:
                self._write(obj)
            self.wait_for_write()  # the run ends with its files written
        finally:
            self._held.clear()
            if self._caught is not None:
                self._caught.restore()

    # --- surviving: an exception, a termination signal ------------------------------------

    def _rng_now(self, portable: bool = True) -> dict[str, Any]:
        rng = rng_state(portable)
        rng["generators"] = [generator.get_state() for generator in self.generators]
        return rng

    def _refuse_framework_resume(self, target: Any, resuming: bool = False) -> None:
        """A framework that keeps the run's position (its loop, its global step)
        resumes it itself: weights put back here would train again from its step 0,
        silently. Refused when attached (the global tier: when fit starts, or at the
        resume), naming the framework's own way."""
        how = framework_resume(target)
        if how is None or not (resuming or self.resume_from is not None or self.on_exception
                               or self.on_signal is not None):
            return
        raise HookError(
            f"{self.where}: {getattr(target, '__qualname__', type(target).__qualname__)} keeps the run's position "
            f"(its loop and step counters) and resumes it itself, so a resume from this checkpoint would put "
            f"the weights back and train again from its first step. Resume with {how}. Here Checkpoint can "
            f"save weights (every_n_steps, save_top_k), without resume_from, on_exception or on_signal.")

    def _fit_started(self, obj: Any) -> None:
        self._refuse_framework_resume(obj)  # attached to the global tier: known only now
        if self.every_n_minutes is not None:
            self._timed_from = _clock()  # the time to the first timed save counts from the run's start
        # After a resume_from restore (registered before): the state the run starts from.
        self._completed, self._interrupted = self.step, False
        if self.on_exception:
            self._rng_completed = self._rng_now(portable=False)
        if self._caught is not None:
            self._caught.install()

    def _step_completed(self, obj: Any) -> None:
        """After each step: the last completed one, and a signal caught during it."""
        self._completed = self.step
        if self.on_exception:
            # ~10 us a step, ~50 us with NumPy imported (no device sync): what a save on an
            # exception holds.
            self._rng_completed = self._rng_now(portable=False)
        caught = self._caught
        if caught is None or not caught.previous:
            return
        signum = caught.signum
        if is_distributed():  # every rank saves at the same step: one all-reduce a step
            signum = max(per_rank(signum or 0)) or None
        if signum is not None:
            self._save_on_signal(obj, signum)

    def _save_on_signal(self, obj: Any, signum: int) -> None:
        assert self._caught is not None
        name = signal.Signals(signum).name
        self._pending.add("signal.pt")
        if self.save_last:
            self._pending.add("last.pt")
        self._interrupted = True
        try:
            self._write(obj)
            self.wait_for_write()  # on disk before the signal takes its course
        except Exception as failure:
            # The platform still ends the process: the signal goes on, the failure is logged
            # (and is the context of what finish raises).
            log.error("%s: %s received; saving the run after step %d failed: %r", self.where, name, self.step,
                      failure)
            self._caught.finish(signum)
            raise
        # A warning: with no logging set up (a script under hookwrap run) it still reaches
        # stderr, so the job's log says where the run can resume from.
        log.warning("%s: %s received; saved the run after step %d to %s (resume_from='signal'), handing the "
                    "signal on", self.where, name, self.step, self.dir / "signal.pt")
        self._caught.finish(signum)

    def _fit_failed(self, obj: Any, exception: BaseException) -> None:
        try:
            try:
                self.wait_for_write()
            except Exception as failure:  # the exception leaving fit goes on; this one is noted on it
                add_note_once(exception, f"{self.where}: also, a checkpoint written in the background failed: "
                                         f"{failure}")
            if self.on_exception and not self._interrupted \
                    and not isinstance(exception, (SystemExit, GeneratorExit)):
                self._save_on_exception(obj, exception)
        finally:
            self._held.clear()
            if self._caught is not None:
                self._caught.restore()

    def is_sharded(self, model: Any) -> bool:
        """Is ``model`` saved in shards (``torch.distributed.checkpoint``)? As
        ``sharded`` says; by default when it is FSDP-wrapped (``fully_shard`` or
        ``FullyShardedDataParallel``)."""
        if self.sharded is not None:
            return self.sharded
        return _is_fsdp(model)

    def _counting(self, target: Any) -> list[Any]:
        """The other callbacks attached to ``target`` that count this one's steps."""
        found: list[Any] = []
        for holder in (_functions(target) if isinstance(target, types.ModuleType) else [target]):
            for cb in stateful_callbacks(holder).values():
                if isinstance(cb, CountingCallback) and cb is not self and cb.step_event == self.step_event \
                        and not any(cb is seen for seen in found) and cb.step > 0:
                    found.append(cb)
        return found

    def _save_on_exception(self, obj: Any, exception: BaseException) -> None:
        """``exception.pt`` (and ``last.pt``): the run as it was after the last completed
        step. Never raises over ``exception``: a save that fails adds a note to it."""
        what = type(exception).__name__
        if is_distributed():
            # The ranks that did not raise wait in their next collective (a save's is one):
            # a save here could hang this rank too. on_signal is the distributed-safe save.
            why = "under torch.distributed a save is a collective the other ranks may never join"
            log.warning("%s: %s raised; not saved: %s", self.where, what, why)
            add_note_once(exception, f"{self.where}: no checkpoint saved on this exception: {why}.")
            return
        try:
            if self._counts_completed and self.step > self._completed:
                # The step that raised never completed: every callback counting it as
                # started (EarlyStopping's step, ...) is saved as before it, so that its
                # rerun after the resume counts it once.
                for cb in self._counting(obj if obj is not None else self._target):
                    cb.step -= self.step - self._completed
                self.step = self._completed
            rng = portable_rng(self._rng_completed) if self._rng_completed is not None else self._rng_now()
            self._pending.add("exception.pt")
            if self.save_last:
                self._pending.add("last.pt")
            self._write(obj, rng=rng)
            self.wait_for_write()
            self._interrupted = True
        except Exception as failure:
            log.error("%s: %s raised; saving it failed: %r", self.where, what, failure)
            add_note_once(exception, f"{self.where}: the checkpoint on this exception could not be saved: "
                                     f"{failure!r}")
            return
        log.info("%s: %s raised; saved the run after step %d (the last completed)", self.where, what, self.step)
        add_note_once(exception, f"{self.where}: saved the run after step {self.step}, the last completed, to "
                                 f"{str(self.dir / 'exception.pt')!r}; checkpoint.resume(obj, 'exception') "
                                 f"continues from there.")

    # --- writing ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "epoch": self.epoch,
                "top_k": [list(entry) for entry in self.top_k]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch = saved(state, "epoch", COUNT, self.where)  # all checked before anything is set
        top_k = saved(state, "top_k", _TOP_K, self.where)
        super().load_state_dict(state)
        self.epoch, self.top_k = epoch, top_k
        self._kept = list(top_k)

    def checkpoint(self, obj: Any, model: Any = _NOT_GIVEN, optimizer: Any = _NOT_GIVEN,
                   scheduler: Any = _NOT_GIVEN, *, rng: dict[str, Any] | None = None) -> dict[str, Any]:
        """The dict a file holds, for the state of this process now (``rng``: the RNG
        states to hold instead of the current ones, as ``_rng_now`` makes them)."""
        found = self._objects(obj, model, optimizer, scheduler)
        if found["model"] is None:
            raise HookError(f"{self.where}: no model to save; pass model= the module or its attribute name.")
        if self.is_sharded(found["model"]):
            # Each rank's shards, for torch.distributed.checkpoint; the rest as usual.
            from torch.distributed.checkpoint.state_dict import get_state_dict

            optimizer = found["optimizer"]
            model_state, optimizer_state = get_state_dict(found["model"], optimizer if optimizer is not None else [])
            shards = {"model": model_state} | ({"optimizer": optimizer_state} if optimizer is not None else {})
            state: dict[str, Any] = {"sharded": shards}
        else:
            state = {"model": found["model"].state_dict()}
            if found["optimizer"] is not None:
                state["optimizer"] = found["optimizer"].state_dict()
        if found["scheduler"] is not None:
            state["scheduler"] = found["scheduler"].state_dict()
        if rng is None:
            rng = self._rng_now()
        state.update(step=self.step, epoch=self.epoch, rng=gather_ranks(rng),
                     callbacks=self._state_of_callbacks(obj if obj is not None else self._target),
                     monitor=self.monitor, best=self.best.value)
        return state

    def _write(self, obj: Any, rng: dict[str, Any] | None = None) -> None:
        # A NanGuard deciding late (no host sync per step) on this object's checks
        # decides now: a run that went non-finite stops here, its NaN weights unsaved.
        settle(obj)
        # One transaction: the files written, then top-k committed and the evicted files
        # deleted. A write that fails (a full disk) leaves top-k and the folder as they
        # were at the last write, and raises.
        self.wait_for_write()  # one write in flight at most: the last one first
        names = sorted(self._pending)
        kept = {entry[2] for entry in self._kept}
        new_best = [name for name in names if name in {entry[2] for entry in self.top_k} and name not in kept]
        # The best files first: a last.pt written names only top-k files that exist.
        names.sort(key=lambda name: name not in new_best)
        try:
            state = self.checkpoint(obj, rng=rng)  # a collective under torch.distributed: every rank
            shards = state.pop("sharded", None)
            if self.async_write and shards is None and not is_distributed():
                self._write_in_background(state, names, new_best)
                return
            if shards is not None:
                state["sharded"] = sorted(shards)  # what the folder's shards hold
                self.io.save_sharded(state, shards, [self.dir / name for name in names], self.where)  # every rank
            with written_on_rank_zero(self.where, f"{', '.join(names)} at step {self.step}"):
                if is_rank_zero() and shards is None:
                    self.io.save(state, *(self.dir / name for name in names))
        except BaseException:
            self._roll_back(new_best)
            raise
        evicted, self._evicted = self._evicted, []
        self._pending.clear()
        self._kept = list(self.top_k)
        if is_rank_zero():
            self.saved += len(names)
            for name in evicted:
                try:
                    self.io.remove(self.dir / name)
                except OSError as exc:  # written and committed: a file left over is said, not fatal
                    warnings.warn(f"{self.where}: {name}, no longer among the {self.save_top_k} best, could "
                                  f"not be deleted ({exc}); delete it yourself.", HookwrapWarning, stacklevel=2)
            log.info("%s: saved %s at step %d%s", self.where, ", ".join(names), self.step,
                     f" (removed {', '.join(evicted)})" if evicted else "")

    def _write_in_background(self, state: dict[str, Any], names: list[str], new_best: list[str]) -> None:
        """``async_write``: the state serialized now (the tensors copied to the host:
        the files hold this moment), the files written by a thread, committed by
        ``wait_for_write`` (the next write, a step that finds it done, the end of fit)."""
        data = self.io.serialize(state)
        job = _Write(names, new_best, self._evicted, list(self.top_k), self.step)
        self._pending.clear()
        self._evicted = []

        def write() -> None:
            try:
                self.io.write(data, *(self.dir / name for name in names))
            except BaseException as exc:  # raised in the training thread, at wait_for_write
                job.failure = exc

        # Not a daemon: the interpreter waits for it at exit, so no file is left half-made.
        job.thread = threading.Thread(target=write, name=f"hookwrap {self.where}", daemon=False)
        self._in_flight = job
        job.thread.start()

    def wait_for_write(self) -> None:
        """Wait for the checkpoint being written in the background (``async_write``),
        then commit it (top-k, the files it replaces deleted); a write that failed is
        rolled back (top-k and the folder as at the last write) and raised here."""
        job, self._in_flight = self._in_flight, None
        if job is None:
            return
        job.thread.join()
        if job.failure is not None:
            self._roll_back(job.new_best)  # top-k as the folder holds it, nothing pending or evicted
            raise HookError(f"{self.where}: writing {', '.join(job.names)} (step {job.step}) in the background "
                            f"failed: {job.failure!r}. The files and the top-k are as at the last write.") \
                from job.failure
        self._kept = job.top_k
        self.saved += len(job.names)
        for name in job.evicted:
            try:
                self.io.remove(self.dir / name)
            except OSError as exc:
                warnings.warn(f"{self.where}: {name}, no longer among the {self.save_top_k} best, could "
                              f"not be deleted ({exc}); delete it yourself.", HookwrapWarning, stacklevel=2)
        log.info("%s: saved %s at step %d in the background%s", self.where, ", ".join(job.names), job.step,
                 f" (removed {', '.join(job.evicted)})" if job.evicted else "")

    def _roll_back(self, new_best: list[str]) -> None:
        """A write failed: top-k as the folder holds it (the last write's), nothing
        pending or evicted, and the new best files that were written removed."""
        self.top_k, self._pending, self._evicted = list(self._kept), set(), []
        if is_rank_zero():
            for name in new_best:
                try:
                    self.io.remove(self.dir / name)
                except OSError:
                    pass  # the error that rolled back is the one raised

    # --- resuming -----------------------------------------------------------------------

    def _state_of_callbacks(self, target: Any) -> dict[str, Any]:
        """The state of the callbacks a file holds: the run's (``run_state``), else
        those attached to ``target`` (none without one)."""
        if self.run_state is not None:
            return dict(self.run_state.state())
        return _callback_state(target) if target is not None else {}

    def _load_state_of_callbacks(self, target: Any, state: dict[str, Any], strict: bool) -> None:
        if self.run_state is not None:
            self.run_state.load(state, strict, self.where)
        elif target is not None:
            _load_callback_state(target, state, strict)

    def _resume_at_fit(self, obj: Any) -> None:
        assert self.resume_from is not None
        try:
            self.resume(obj, self.resume_from, missing_ok=str(self.resume_from) in ("last", "best"))
        except BaseException:
            # The run never started: an on_exception save now would write the untrained
            # model over the very file it failed to resume from.
            self._interrupted = True
            raise

    def resolve(self, path: str | os.PathLike[str]) -> StoragePath | None:
        """``"last"``: ``dir/last.pt``; ``"best"``: the best top-k file (None before
        any); ``"exception"``, ``"signal"``: ``dir/exception.pt``, ``dir/signal.pt``
        (``on_exception``, ``on_signal``); else the path itself."""
        if str(path) == "last":
            return self.last_path
        if str(path) in ("exception", "signal"):
            return self.dir / f"{path}.pt"
        if str(path) == "best":
            top_k = self.top_k or self._saved_top_k()
            if not top_k:
                return None
            return self.dir / top_k[0][2]
        return storage_path(path, self.where)

    def _saved_top_k(self) -> list[Any]:
        """The top-k ``last.pt`` recorded (a new process knows none yet): checked as
        ``load_state_dict`` checks it, each name a file of this folder, never a path
        elsewhere (``../outside.pt``, ``/abs/path.pt``)."""
        if not self.io.exists(self.last_path):
            return []
        saved_state = self.io.load(self.last_path, map_location="cpu")
        callbacks = saved_state.get("callbacks") if isinstance(saved_state, dict) else None
        own = self._own_state(callbacks).get(self.state_key) if isinstance(callbacks, dict) else None
        if not isinstance(own, dict) or "top_k" not in own:
            return []
        if not _TOP_K.check(own["top_k"]):
            names = [entry[2] for entry in own["top_k"] if isinstance(entry, (list, tuple)) and len(entry) == 3] \
                if isinstance(own["top_k"], (list, tuple)) else []
            bad = [name for name in names if not (isinstance(name, str) and name.endswith(".pt")
                                                   and name == os.path.basename(name) and name not in ("", ".", ".."))]
            raise HookError(f"{self.where}: {str(self.last_path)!r} names its best files "
                            f"{', '.join(map(repr, bad)) if bad else repr(own['top_k'])}, not "
                            f"{_TOP_K.what}; nothing was read. A checkpoint names only files of its own "
                            f"folder: was the file written by hookwrap's Checkpoint, or changed since?")
        return [entry for entry in _TOP_K.convert(own["top_k"]) if self.io.exists(self.dir / entry[2])]

    def _own_state(self, callbacks: dict[str, Any]) -> dict[str, Any]:
        """``callbacks`` with this checkpoint's saved state under its own key: a run
        resumed from another folder (or the same one spelt otherwise) saved it under
        that folder's."""
        if self.state_key in callbacks:
            return callbacks
        saved = [key for key in callbacks if key.startswith("Checkpoint[")]
        if len(saved) != 1:
            return callbacks
        renamed = dict(callbacks)
        renamed[self.state_key] = renamed.pop(saved[0])
        return renamed

    @overload
    def resume(self, obj: Any, path: str | os.PathLike[str] = "last", *, model: Any = ...,
               optimizer: Any = ..., scheduler: Any = ..., strict: bool = ...,
               missing_ok: Literal[False] = ...) -> dict[str, Any]: ...

    @overload
    def resume(self, obj: Any, path: str | os.PathLike[str] = "last", *, model: Any = ...,
               optimizer: Any = ..., scheduler: Any = ..., strict: bool = ...,
               missing_ok: bool) -> dict[str, Any] | None: ...

    def resume(self, obj: Any, path: str | os.PathLike[str] = "last", *, model: Any = _NOT_GIVEN,
               optimizer: Any = _NOT_GIVEN, scheduler: Any = _NOT_GIVEN, strict: bool = True,
               missing_ok: bool = False) -> dict[str, Any] | None:
        """Load ``path`` (``"last"``, ``"best"`` or a file) back: the model,
        optimizer and scheduler (given, else read from ``obj`` as when saving),
        the step and epoch counters, this process's RNG states, and the state of
        every callback attached to ``obj`` (``hookwrap.load_callback_state``,
        ``strict`` as there: attach the same callbacks first). Returns the loaded
        dict (``["step"]``, ``["epoch"]``: where to continue the loop), or None
        when ``missing_ok`` and there is no such file. Under torch.distributed
        every rank calls it and loads the file onto its model's device. The file is
        read with ``torch.load(weights_only=True)``: tensors and plain data, never code
        (anything else is a HookError naming it). Refused on
        a framework's trainer that resumes its runs itself (HF ``Trainer``,
        Lightning, ignite), naming its way."""
        self._refuse_framework_resume(obj, resuming=True)
        self.wait_for_write()  # a file still being written is read whole
        file = self.resolve(path)
        if not self.io.exists_on_every_rank(file, self.where):
            if missing_ok:
                return None
            raise HookError(f"{self.where}: no checkpoint to resume from at "
                            f"{str(file) if file is not None else repr(str(path))} (none saved yet).")
        assert file is not None
        found = self._objects(obj, model, optimizer, scheduler)
        if found["model"] is None:
            raise HookError(f"{self.where}: no model to restore; pass model= the module.")
        state: dict[str, Any] = self.io.load(file, map_location=_device_of(found["model"]))
        rng = of_this_rank(state["rng"])
        saved_generators = rng.get("generators", [])
        if len(saved_generators) != len(self.generators):
            raise HookError(f"{self.where}: {str(file)!r} holds the state of {len(saved_generators)} "
                            f"generator(s), and generators= names {len(self.generators)}. Pass the same "
                            f"generators as when it was saved.")
        # What can fail is checked before anything is loaded: a resume that fails
        # leaves the model, the optimizer and the callbacks as they were.
        shards = list(state.get("sharded", ()))  # a sharded checkpoint: what its shards hold
        for what in ("optimizer", "scheduler"):
            if found[what] is not None and what not in state and what not in shards:
                raise HookError(f"{self.where}: {str(file)!r} holds no {what} state to restore; "
                                f"pass {what}=None to restore without it.")
        if not shards:
            _check_fits(found["model"], state["model"], f"{self.where}: {str(file)!r}")
        target = obj if obj is not None else self._target
        before = self._state_of_callbacks(target)
        self._load_state_of_callbacks(target, self._own_state(state["callbacks"]), strict)  # all or nothing
        try:
            if shards:  # every rank reads its own shards (a collective)
                self.io.load_sharded(file, found["model"], found["optimizer"])
            for what in ("optimizer", "scheduler"):
                if found[what] is not None and what not in shards:
                    found[what].load_state_dict(state[what])
        except Exception:
            self._load_state_of_callbacks(target, before, strict=False)
            raise
        if not shards:
            found["model"].load_state_dict(state["model"])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        set_rng_state(rng)
        for generator, generator_state in zip(self.generators, saved_generators):
            generator.set_state(generator_state.cpu())
        self._completed = self.step
        self._rng_completed = self._rng_now(portable=False) if self.on_exception else None
        self._pending.clear()
        self._evicted.clear()
        # Resumed from an earlier file, its top-k may name files the run it abandons
        # evicted since: they are not the best kept any more.
        self.top_k = [entry for entry in self.top_k if self.io.exists(self.dir / entry[2])]
        self._kept = list(self.top_k)
        log.info("%s: resumed from %s at step %d, epoch %d", self.where, str(file), self.step, self.epoch)
        return state


class _Write:
    """A checkpoint being written in the background: what to commit when it is done."""

    def __init__(self, names: list[str], new_best: list[str], evicted: list[str], top_k: list[Any],
                 step: int) -> None:
        self.names, self.new_best, self.evicted, self.top_k, self.step = names, new_best, evicted, top_k, step
        self.thread: threading.Thread = threading.Thread()
        self.failure: BaseException | None = None


def _is_top_k(value: Any) -> bool:
    """A saved top-k: [value, step, file name] entries, each name a file of the folder
    (it is deleted when evicted: never a path elsewhere)."""
    return isinstance(value, (list, tuple)) and all(
        isinstance(entry, (list, tuple)) and len(entry) == 3
        and COUNT.check(entry[1]) and _NUMBER.check(entry[0])
        and isinstance(entry[2], str) and entry[2].endswith(".pt")
        and entry[2] == os.path.basename(entry[2]) and entry[2] not in ("", ".", "..")
        for entry in value)


_NUMBER = Saved(lambda value: value is not None and NUMBER_OR_NONE.check(value), "a number")
_TOP_K = Saved(_is_top_k, "a list of [value, step, file name] entries, each name a .pt file of the folder",
               lambda value: [(float(v), int(s), str(n)) for v, s, n in value])


def _check_fits(model: Any, saved: Any, where: str) -> None:
    """Refuse weights ``model`` cannot load (other names or shapes) before any is copied
    (``load_state_dict`` copies the ones that fit, then raises)."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    shapes = sorted(name for name in set(own) & set(saved)
                    if tuple(getattr(own[name], "shape", ())) != tuple(getattr(saved[name], "shape", ())))
    if missing or unexpected or shapes:
        said = [f"missing {', '.join(missing[:5])}" if missing else "",
                f"unexpected {', '.join(unexpected[:5])}" if unexpected else "",
                f"other shapes for {', '.join(shapes[:5])}" if shapes else ""]
        raise HookError(f"{where} holds weights of another model ({'; '.join(s for s in said if s)}); "
                        f"nothing was restored. Resume into the model it was saved from.")


def _functions(module: Any) -> list[Any]:
    return [value for value in vars(module).values() if is_join_point(value)]


def _callback_state(target: Any) -> dict[str, Any]:
    """``hookwrap.callback_state`` of an object or hookable function; of a module,
    that of its hookable functions together."""
    if not isinstance(target, types.ModuleType):
        return callback_state(target)
    merged: dict[str, Any] = {}
    for function in _functions(target):
        merged.update(callback_state(function))
    return merged


def _load_callback_state(target: Any, state: dict[str, Any], strict: bool) -> None:
    if not isinstance(target, types.ModuleType):
        load_callback_state(target, state, strict=strict)
        return
    functions = _functions(target)
    attached = {key for function in functions for key in stateful_callbacks(function)}
    unused = sorted(set(state) - attached)
    if strict and unused:
        raise HookError(f"load_callback_state({target.__name__}): saved state for "
                        f"{', '.join(map(repr, unused))}, which no attached callback takes. Attach the "
                        f"same callbacks as when the state was saved, or pass strict=False.")
    for function in functions:
        keys = stateful_callbacks(function)
        load_callback_state(function, {key: state[key] for key in keys if key in state}, strict=strict)
