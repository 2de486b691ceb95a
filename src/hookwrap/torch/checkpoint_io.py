"""Checkpoint I/O: how the checkpoint policies' files are written, read, found and
removed, and the state a checkpoint holds beside the weights (the RNG states of
every rank).

``Checkpoint`` and ``BestCheckpoint`` decide when to save, what, which files to
keep and how to resume; everything that touches storage goes through their
``CheckpointIO`` (as Lightning's ``ModelCheckpoint`` writes through a
``CheckpointIO`` plugin, and ignite's ``Checkpoint`` through a ``DiskSaver``).
This one writes files with ``torch.save`` and reads them with ``torch.load``:
local paths, and URLs (``memory://run1``, ``s3://bucket/run``, ``file:///...``)
through ``fsspec`` where it is installed (torch depends on it); another storage
(sharded state) is another ``CheckpointIO`` with the same methods.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from ..errors import HookError
from ..extend import process_rank
from .distributed import is_distributed, ranks_where

__all__ = ["CheckpointIO", "RemotePath", "StoragePath", "gather_ranks", "of_this_rank", "rng_state",
           "set_rng_state", "storage_path"]


class RemotePath:
    """A path on an ``fsspec`` filesystem other than the local one: ``fs`` and the
    ``path`` on it, shown (``str``) as the URL it was given as. ``/`` joins a name,
    as on a ``pathlib.Path``."""

    __slots__ = ("fs", "path", "protocol")

    def __init__(self, fs: Any, path: str, protocol: str) -> None:
        self.fs, self.path, self.protocol = fs, path.rstrip("/") or "/", protocol

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(self.fs, f"{self.path.rstrip('/')}/{name}", self.protocol)

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rpartition("/")[2]

    @property
    def parent(self) -> RemotePath:
        return RemotePath(self.fs, self.path.rstrip("/").rpartition("/")[0] or "/", self.protocol)

    def __str__(self) -> str:
        return f"{self.protocol}://{self.path.lstrip('/')}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and (self.fs, self.path) == (other.fs, other.path)

    def __hash__(self) -> int:
        return hash((self.protocol, self.path))


StoragePath = Union[Path, RemotePath]


def storage_path(value: str | os.PathLike[str], where: str) -> StoragePath:
    """Where a checkpoint goes: a local ``Path``, or for a URL (``PROTOCOL://...``)
    the ``fsspec`` filesystem it names: its local one as a ``Path`` (written
    atomically, as local paths are), any other as a ``RemotePath``. A URL without
    fsspec, or a protocol fsspec cannot open, is a HookError saying what to install."""
    text = os.fspath(value)
    if "://" not in text:
        return Path(text)
    try:
        import fsspec
    except ImportError:
        raise HookError(f"{where}: {text!r} is a URL, and URLs are opened with fsspec, which is not "
                        f"installed. pip install fsspec (and the package of the protocol, s3fs for "
                        f"s3://), or pass a local path.") from None
    try:
        fs, path = fsspec.core.url_to_fs(text)
    except (ImportError, ValueError) as exc:
        raise HookError(f"{where}: fsspec cannot open {text!r}: {exc}. Install the package of that "
                        f"protocol, or pass a local path.") from None
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return Path(path)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return RemotePath(fs, path, protocol)


class CheckpointIO:
    """Checkpoint files with ``torch.save`` / ``torch.load``: on the local filesystem
    (a ``Path``), or on an ``fsspec`` one (a ``RemotePath``, see ``storage_path``).

    ``save`` writes a local file atomically: to ``.NAME.PID.tmp`` in the same folder,
    flushed and synced to disk, then renamed over ``NAME`` (``os.replace``, atomic on
    POSIX and Windows), so a crash mid-write never leaves a torn checkpoint and a
    failed write leaves the previous file whole. Other filesystems are written in
    one ``open(path, "wb")`` of the serialized bytes: object stores (s3, gcs) make an
    object visible only when its upload completes, and a rename there is a copy, no
    more atomic than the write. Under torch.distributed the policy saves on rank
    0 alone (``written_on_rank_zero``) and every rank loads: the files must be on a
    filesystem every rank sees (``exists_on_every_rank`` says when they are not)."""

    def save(self, checkpoint: Mapping[str, Any], *paths: StoragePath) -> None:
        """Write ``checkpoint`` (serialized once) to each of ``paths``, atomically
        where the filesystem allows, making their folders."""
        import torch

        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getvalue()
        for path in paths:
            if isinstance(path, RemotePath):
                path.fs.makedirs(path.parent.path, exist_ok=True)
                with path.fs.open(path.path, "wb") as f:
                    f.write(data)
                continue
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

    def load(self, path: StoragePath, map_location: Any = None, weights_only: bool = True) -> Any:
        """What ``save`` wrote to ``path`` (``torch.load``), its tensors onto ``map_location``."""
        import torch

        if isinstance(path, RemotePath):
            with path.fs.open(path.path, "rb") as f:
                data = f.read()
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)
        return torch.load(path, map_location=map_location, weights_only=weights_only)

    def exists(self, path: StoragePath) -> bool:
        """Is there a checkpoint file at ``path``?"""
        if isinstance(path, RemotePath):
            return bool(path.fs.isfile(path.path))
        return path.is_file()

    def exists_on_every_rank(self, path: StoragePath | None, where: str) -> bool:
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

    def remove(self, path: StoragePath) -> None:
        """Delete the file at ``path``; one already gone is no error."""
        if isinstance(path, RemotePath):
            if path.fs.exists(path.path):
                path.fs.rm(path.path)
            return
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
