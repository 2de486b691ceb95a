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

import contextlib
import io
import os
import re
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Callable, Union

from ..errors import HookError
from ..extend import anchored, process_rank, weights_only_load
from .distributed import is_distributed, ranks_where

__all__ = ["CheckpointIO", "RemotePath", "StoragePath", "gather_ranks", "local_path", "of_this_rank",
           "portable_rng", "rng_state", "set_rng_state", "storage_path", "weights_only_load"]


class RemotePath:
    """A path on an ``fsspec`` filesystem other than the local one: ``fs`` and the
    ``path`` on it, shown (``str``) as the URL it was given as. ``/`` joins a name,
    and ``name``, ``parent``, ``exists()``, ``is_file()``, ``is_dir()`` and
    ``iterdir()`` are those of a ``pathlib.Path``, so that ``checkpoint.dir`` reads
    the same either way."""

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

    def exists(self) -> bool:
        return bool(self.fs.exists(self.path))

    def is_file(self) -> bool:
        return bool(self.fs.isfile(self.path))

    def is_dir(self) -> bool:
        return bool(self.fs.isdir(self.path))

    def iterdir(self) -> Iterator[RemotePath]:
        """What the folder holds, as ``Path.iterdir`` gives it."""
        for entry in self.fs.ls(self.path, detail=False):
            yield RemotePath(self.fs, str(entry), self.protocol)

    def __str__(self) -> str:
        return f"{self.protocol}://{self.path.lstrip('/')}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and (self.fs, self.path) == (other.fs, other.path)

    def __hash__(self) -> int:
        return hash((self.protocol, self.path))


StoragePath = Union[Path, RemotePath]

# write_atomically's temporary file: ".NAME.PID.tmp".
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]{1,10})\.tmp")


def _running(pid: int) -> bool:
    """Is process ``pid`` running on this machine (as far as this process can tell)?"""
    if os.name == "nt":
        return True  # os.kill would end it there: no stray file is removed on Windows
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True  # someone else's, or unknown: kept
    return True


def _is_url(text: str) -> bool:
    """A URL as fsspec reads one: ``PROTOCOL://...``, or ``file:`` / ``local:`` followed by
    a path (``file:/abs/ck`` is ``/abs/ck``; ``file:ck`` is ``ck`` in the working folder)."""
    return "://" in text or text.lower().startswith(("file:", "local:"))


def storage_path(value: str | os.PathLike[str], where: str) -> StoragePath:
    """Where a checkpoint goes: a local ``Path``, or for a URL (``PROTOCOL://...``,
    ``file:/abs``) the ``fsspec`` filesystem it names, read as fsspec reads it: its
    local one as a ``Path`` (written atomically, as local paths are), any other as a
    ``RemotePath``. A URL without fsspec, or a protocol fsspec cannot open, is a
    HookError saying what to install. A relative path given on ``hookwrap run``'s
    command line is made absolute against the folder it ran in (``_paths``)."""
    text = os.fspath(anchored(value))
    if not _is_url(text):
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


def local_path(value: str | os.PathLike[str], where: str) -> Path:
    """A file opened with ``open`` (a CSV, a log folder): a local path, or a URL of the
    local filesystem (``file:/abs/m.csv``, ``file:///abs/m.csv``) read as fsspec reads
    it; a URL of another filesystem is a HookError. Relative paths from ``hookwrap
    run``'s command line are made absolute as ``storage_path`` makes them."""
    path = storage_path(value, where)
    if isinstance(path, RemotePath):
        raise HookError(f"{where}: {os.fspath(value)!r} is on {path.protocol}://, and this file is written "
                        f"with open() on the local filesystem. Pass a local path.")
    return path


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
        self.write(self.serialize(checkpoint), *paths)

    @staticmethod
    def serialize(checkpoint: Mapping[str, Any]) -> bytes:
        """``checkpoint`` as ``torch.save`` writes it: the tensors copied to the host
        now, so what is written later is the state of this moment."""
        import torch

        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        return buffer.getvalue()

    def write(self, data: bytes, *paths: StoragePath) -> None:
        """``data`` (``serialize``'s) as each of ``paths``, atomically where the
        filesystem allows, making their folders: safe to run in another thread."""
        swept: set[Path] = set()
        for path in paths:
            if isinstance(path, RemotePath):
                path.fs.makedirs(path.parent.path, exist_ok=True)
                with path.fs.open(path.path, "wb") as f:
                    f.write(data)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.parent not in swept:
                swept.add(path.parent)
                self.remove_stray_temporaries(path.parent, [p.name for p in paths if isinstance(p, Path)])
            self.write_atomically(path, data)

    def remove_stray_temporaries(self, folder: Path, names: list[str]) -> list[Path]:
        """Delete the temporary files a write killed midway left in ``folder``
        (``write_atomically``'s ``.NAME.PID.tmp``, its process gone), and return them.
        Only of hookwrap's naming: NAME one of ``names`` (being written now) or a
        ``.pt`` file, PID a process that is not this one and not running here."""
        removed: list[Path] = []
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return removed
        for entry in entries:
            match = _TEMPORARY.fullmatch(entry.name)
            if match is None or not (match["name"] in names or match["name"].endswith(".pt")):
                continue
            pid = int(match["pid"])
            if pid == os.getpid() or _running(pid) or not entry.is_file(follow_symlinks=False):
                continue
            try:
                os.unlink(entry.path)
            except OSError:
                continue  # gone already, or not ours to delete
            removed.append(Path(entry.path))
        return removed

    def write_atomically(self, path: Path, data: bytes) -> None:
        """``data`` as the whole of ``path``: a temporary file beside it, then renamed."""
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                f.write(data)

        self.replace_atomically(path, write)

    @staticmethod
    def replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
        """``write(tmp)`` makes the file at a temporary path beside ``path``
        (``.NAME.PID.tmp``, what ``remove_stray_temporaries`` sweeps), which is synced
        to disk, then renamed over ``path``: whole or not at all."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            write(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)  # atomic on POSIX and Windows
        finally:
            tmp.unlink(missing_ok=True)

    # --- sharded: torch.distributed.checkpoint ----------------------------------------

    def save_sharded(self, state: Mapping[str, Any], sharded: dict[str, Any], paths: list[StoragePath],
                     where: str) -> None:
        """A sharded checkpoint at each of ``paths``, a folder: ``sharded`` (the model's
        and optimizer's state from ``get_state_dict``) written by
        ``torch.distributed.checkpoint.save``, each rank its own shards (a collective:
        every rank calls this), and ``state`` (everything else) as ``state.pt``, from
        rank 0. Written into ``.NAME.tmp`` beside the folder, then swapped in: the old
        folder renamed aside, the new one renamed over, the old one deleted, so a crash
        leaves one whole checkpoint under ``NAME`` or ``.NAME.old``."""
        import shutil

        from torch.distributed.checkpoint.state_dict_saver import save

        from .distributed import written_on_rank_zero

        local = [path for path in paths if isinstance(path, Path)]
        if len(local) != len(paths):
            raise HookError(f"{where}: a sharded checkpoint (torch.distributed.checkpoint) is written to a "
                            f"local folder; {', '.join(str(p) for p in paths if p not in local)} is a URL. "
                            f"Pass a local path every rank shares.")
        rank_zero = process_rank() == 0
        first = local[0]
        tmp = first.with_name(f".{first.name}.tmp")  # one name on every rank: they write together
        with written_on_rank_zero(where, f"the folder for {first.name}"):
            if rank_zero:
                shutil.rmtree(tmp, ignore_errors=True)  # a crashed write's
                tmp.mkdir(parents=True)
        with _one_process_is_meant():
            save(sharded, checkpoint_id=tmp)
        with written_on_rank_zero(where, f"{', '.join(p.name for p in local)}"):
            if rank_zero:
                import torch

                buffer = io.BytesIO()
                torch.save(dict(state), buffer)
                self.write_atomically(tmp / "state.pt", buffer.getvalue())
                for path in local[1:]:
                    copy = path.with_name(f".{path.name}.tmp")
                    shutil.rmtree(copy, ignore_errors=True)
                    shutil.copytree(tmp, copy)
                    _swap_in(copy, path)
                _swap_in(tmp, first)

    def load_sharded(self, path: StoragePath, model: Any, optimizer: Any) -> None:
        """Load what ``save_sharded`` wrote at ``path`` into ``model`` (and
        ``optimizer``): each rank reads the shards it holds (a collective)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load

        model_state, optimizer_state = get_state_dict(model, optimizer if optimizer is not None else [])
        target: dict[str, Any] = {"model": model_state}
        if optimizer is not None:
            target["optimizer"] = optimizer_state
        with _one_process_is_meant():
            load(target, checkpoint_id=path)
        set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=target["model"],
                       optim_state_dict=target.get("optimizer", {}))

    def load(self, path: StoragePath, map_location: Any = None) -> Any:
        """What ``save`` wrote to ``path``, its tensors onto ``map_location``; of a sharded
        checkpoint (a folder), its ``state.pt``. Read with ``weights_only_load``: never
        code, whoever wrote the file."""
        if isinstance(path, Path) and path.is_dir():
            path = path / "state.pt"
        if isinstance(path, RemotePath):
            with path.fs.open(path.path, "rb") as f:
                data = f.read()
            return weights_only_load(io.BytesIO(data), str(path), map_location)
        return weights_only_load(path, str(path), map_location)

    def exists(self, path: StoragePath) -> bool:
        """Is there a checkpoint file at ``path``?"""
        if isinstance(path, RemotePath):
            return bool(path.fs.isfile(path.path))
        return path.is_file() or (path / ".metadata").is_file()  # a file, or a sharded folder

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
        if path.is_dir():  # a sharded checkpoint
            import shutil

            shutil.rmtree(path)
            return
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _one_process_is_meant() -> Iterator[None]:
    """Around a DCP save or load: without torch.distributed, one process is what
    ``sharded=True`` meant, so DCP's warning that it assumes so is not shown."""
    with warnings.catch_warnings():
        if not is_distributed():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _swap_in(new: Path, path: Path) -> None:
    """The folder ``new`` renamed to ``path``, over a folder (or file) there: the old one
    renamed aside first (a folder cannot be renamed over a full one), deleted after."""
    import shutil

    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if path.is_dir():
        os.replace(path, old)
    elif path.exists():
        path.unlink()
    os.replace(new, path)
    shutil.rmtree(old, ignore_errors=True)


def rng_state(portable: bool = True) -> dict[str, Any]:
    """This process's RNG states: Python's ``random``, NumPy's global generator
    (when NumPy is imported), torch's CPU generator and every CUDA device's.
    ``portable=False`` keeps NumPy's as NumPy gives it (a fifth of the time, for a
    state taken at every step and rarely saved); ``portable_rng`` converts it."""
    import random

    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return portable_rng(state) if portable else state


def portable_rng(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with NumPy's as plain lists, so that ``torch.load(weights_only=True)``
    takes it."""
    saved = state.get("numpy")
    if saved is None or isinstance(saved, list):
        return state
    kind, keys, pos, has_gauss, cached = saved
    return {**state, "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


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
