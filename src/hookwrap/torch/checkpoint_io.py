"""Checkpoint I/O: how the checkpoint policies' files are written, read, found and
removed, and the state a checkpoint holds beside the weights (the RNG states of
every rank).

``Checkpoint`` and ``BestCheckpoint`` decide when to save, what, which files to
keep and how to resume; everything that touches storage goes through their
``CheckpointIO`` (as Lightning's ``ModelCheckpoint`` writes through a
``CheckpointIO`` plugin, and ignite's ``Checkpoint`` through a ``DiskSaver``).
This one writes local files with ``torch.save`` and reads them with
``torch.load``; another storage (remote paths, sharded state) is another
``CheckpointIO`` with the same methods.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import HookError
from ..extend import process_rank
from .distributed import is_distributed, ranks_where

__all__ = ["CheckpointIO", "gather_ranks", "of_this_rank", "rng_state", "set_rng_state"]


class CheckpointIO:
    """Checkpoint files on the local filesystem, with ``torch.save`` / ``torch.load``.

    ``save`` writes atomically: to ``.NAME.PID.tmp`` in the same folder, flushed and
    synced to disk, then renamed over ``NAME`` (``os.replace``, atomic on POSIX and
    Windows), so a crash mid-write never leaves a torn checkpoint and a failed write
    leaves the previous file whole. Under torch.distributed the policy saves on rank
    0 alone (``written_on_rank_zero``) and every rank loads: the files must be on a
    filesystem every rank sees (``exists_on_every_rank`` says when they are not)."""

    def save(self, checkpoint: Mapping[str, Any], *paths: Path) -> None:
        """Write ``checkpoint`` (serialized once) to each of ``paths``, atomically,
        making their folders."""
        import torch

        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getvalue()
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.write_atomically(path, data)

    def write_atomically(self, path: Path, data: bytes) -> None:
        """``data`` as the whole of ``path``: a temporary file beside it, then renamed."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # atomic on POSIX and Windows
        finally:
            tmp.unlink(missing_ok=True)

    def load(self, path: Path, map_location: Any = None, weights_only: bool = True) -> Any:
        """What ``save`` wrote to ``path`` (``torch.load``), its tensors onto ``map_location``."""
        import torch

        return torch.load(path, map_location=map_location, weights_only=weights_only)

    def exists(self, path: Path) -> bool:
        """Is there a checkpoint file at ``path``?"""
        return path.is_file()

    def exists_on_every_rank(self, path: Path | None, where: str) -> bool:
        """``exists(path)`` (False for None); under torch.distributed the same answer on
        every rank (a collective: every rank loads it, or none), a file that only some
        ranks see being an error naming them."""
        found = path is not None and self.exists(path)
        if not is_distributed():
            return found
        import torch.distributed as dist

        seen = ranks_where(found)
        if len(seen) not in (0, dist.get_world_size()):
            raise HookError(f"{where}: {str(path)!r} exists on rank(s) {', '.join(map(str, seen))} only. "
                            f"Put it on a filesystem every rank shares.")
        return bool(seen)

    def remove(self, path: Path) -> None:
        """Delete the file at ``path``; one already gone is no error."""
        path.unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    """This process's RNG states: Python's ``random``, NumPy's global generator
    (when NumPy is imported), torch's CPU generator and every CUDA device's."""
    import random

    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        # Plain lists, so that torch.load(weights_only=True) takes them.
        state["numpy"] = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state()`` returned (CUDA devices as many as both have)."""
    import random

    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"].cpu())
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, numpy.asarray(keys, dtype=numpy.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        devices = min(len(state["cuda"]), torch.cuda.device_count())
        for index in range(devices):
            torch.cuda.set_rng_state(state["cuda"][index].cpu(), index)


def gather_ranks(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state``, in rank order (one all-gather under torch.distributed,
    a collective; this rank's alone otherwise)."""
    if not is_distributed():
        return [state]
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state)
    return gathered


def of_this_rank(states: list[dict[str, Any]]) -> dict[str, Any]:
    """This rank's entry of what ``gather_ranks`` returned (the first one's where the
    run had fewer ranks)."""
    rank = process_rank()
    return states[rank] if rank < len(states) else states[0]
