"""``BestCheckpoint``: keep the best model and optimizer state on disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from ..errors import HookError
from ._attach import DefaultEvent, reader, from_object, is_rank_zero
from ._best import MonitoredCallback
from .distributed import any_rank, is_distributed, ranks_where

__all__ = ["BestCheckpoint"]


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
    same way from that join point).

    Under torch.distributed ``monitor`` is the mean over the ranks (one all-reduce
    per evaluation), so every rank agrees on "improved"; rank 0 alone writes, then
    every rank waits for the write (an all-reduce of "did it fail", the barrier: no
    rank reads a half-written file, and a failed write stops every rank). The
    restore loads the file on each rank onto the device of the model's parameters
    (``map_location``); ``path`` must be on a filesystem every rank sees.
    """

    def __init__(self, path: str | os.PathLike[str], monitor: str = "val_loss", mode: str = "min",
                 event: str = "evaluate", model: Any = "model", optimizer: Any = "optimizer",
                 restore_best: bool = False, min_delta: float = 0.0, fit_event: str = "fit",
                 step_event: str | None = DefaultEvent("step")) -> None:
        self.path = Path(path)
        self.model, self.optimizer = model, optimizer
        self.restore_best, self.fit_event = restore_best, fit_event
        self.saved = 0
        # The model and optimizer of the call in progress, per event: taken before
        # the call (argument or attribute), used after it, then let go.
        self._held: dict[tuple[str, str], Any] = {}
        super().__init__(monitor, mode, min_delta, event, step_event)

    @property
    def where(self) -> str:
        return f"BestCheckpoint({str(self.path)!r})"

    @property
    def state_key(self) -> str:
        return f"BestCheckpoint[{self.path}]"

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
        try:
            super().observe(obj, value)
        finally:
            self._release(self.event)

    def improved(self, obj: Any, value: float) -> None:
        failed = True
        try:
            if is_rank_zero():
                model, optimizer = self._held.get((self.event, "model")), self._held.get((self.event, "optimizer"))
                self.save(obj, value, model, optimizer)
            failed = False
        finally:
            # The barrier after the write, which also tells the others if it failed
            # (rank 0 then raises its own error, every other rank this one).
            if is_distributed() and any_rank(failed) and not failed:
                raise HookError(
                    f"{self.where}: rank 0 failed to write the checkpoint at step {self.step} "
                    f"(its error says why); stopping every rank."
                )

    def save(self, obj: Any, value: float, model: Any = None, optimizer: Any = None) -> None:
        """Write the checkpoint: ``model`` and ``optimizer`` given, else read from ``obj``."""
        import torch

        if model is None:
            model = from_object(obj, self.model, "model", self.where)
        checkpoint = {"model": model.state_dict(), "monitor": self.monitor, "value": value,
                      "step": self.step}
        if self.optimizer is not None:
            if optimizer is None:
                optimizer = from_object(obj, self.optimizer, "optimizer", self.where)
            checkpoint["optimizer"] = optimizer.state_dict()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            torch.save(checkpoint, tmp)
            os.replace(tmp, self.path)  # atomic on POSIX and Windows
        finally:
            tmp.unlink(missing_ok=True)
        self.saved += 1

    def _restore(self, obj: Any) -> None:
        model, optimizer = self._release(self.fit_event)
        self.load_best(obj, model, optimizer)

    def load_best(self, obj: Any, model: Any = None, optimizer: Any = None) -> None:
        """Load the best weights saved so far into the model (and optimizer):
        ``model`` and ``optimizer`` given, else read from ``obj``. Onto the device of
        the model's parameters; under torch.distributed on every rank."""
        import torch

        exists = self.path.exists()
        if is_distributed():  # every rank loads, or none: the same answer everywhere
            seen = ranks_where(exists)
            if len(seen) not in (0, torch.distributed.get_world_size()):
                raise HookError(
                    f"{self.where}: rank 0 wrote {str(self.path)!r} but only rank(s) "
                    f"{', '.join(map(str, seen))} can read it. Put it on a filesystem every "
                    f"rank shares."
                )
            exists = bool(seen)
        if not exists:
            return  # nothing improved yet: the model is as good as it gets
        if model is None:
            model = from_object(obj, self.model, "model", self.where)
        checkpoint = torch.load(self.path, map_location=_device_of(model), weights_only=True)
        model.load_state_dict(checkpoint["model"])
        if self.optimizer is not None and "optimizer" in checkpoint:
            if optimizer is None:
                optimizer = from_object(obj, self.optimizer, "optimizer", self.where)
            optimizer.load_state_dict(checkpoint["optimizer"])


def _device_of(model: Any) -> Any:
    """Where the model's parameters live (the first one's device), else the CPU."""
    import torch

    parameters = getattr(model, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    return first.device if first is not None else torch.device("cpu")
