"""Decisions every rank takes together under ``torch.distributed``.

A callback that ends or changes the run (stop early, stop on a NaN, save "the
best" checkpoint) must decide the same on every rank: a rank that leaves the loop
alone leaves the others waiting in their next collective (DDP's gradient
all-reduce) forever. These helpers reduce a decision's input across the default
process group, with one collective each, so that every rank gets the same answer:

* ``any_rank(flag)``: ``True`` on every rank when ``flag`` is true on any;
* ``ranks_where(flag)``: the ranks where ``flag`` is true (to say which);
* ``all_ranks_mean(value)``: the mean of a number over the ranks;
* ``per_rank(value)``: every rank's whole number (a step, a count), in rank order.

When torch.distributed is not initialised (one process, the usual case) they
communicate nothing and return their input as a one-rank answer; the check costs a
dictionary lookup and two calls (``is_available() and is_initialized()``, asked by
``hookwrap.extend.process_group``, the one place that asks), and imports nothing.
Each is a collective when it is initialised: every rank must call
it, in the same order as the other collectives, or they wait for each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..extend import process_group

__all__ = ["all_ranks_mean", "any_rank", "is_distributed", "per_rank", "ranks_where", "written_on_rank_zero"]


def is_distributed() -> bool:
    """True when torch.distributed's default process group is initialised."""
    return process_group() is not None


def _device(dist: Any) -> Any:
    """The device a collective's tensor lives on for the default group's backend:
    the CPU for gloo and MPI (and a ``cpu:gloo,cuda:nccl`` pair), the current CUDA
    device for NCCL."""
    import torch

    backend = str(dist.get_backend()).lower()
    if "nccl" in backend and "cpu:" not in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank(flag: bool) -> bool:
    """``True`` on every rank when ``flag`` is true on at least one rank (one
    all-reduce, MAX); ``flag`` itself when not distributed. For a stop decision:

        if any_rank(loss_is_bad):   # every rank stops at the same step
            raise hookwrap.StopTraining("bad loss on some rank")
    """
    dist = process_group()
    if dist is None:
        return bool(flag)
    import torch

    tensor = torch.tensor([1 if flag else 0], dtype=torch.int64, device=_device(dist))
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def ranks_where(flag: bool) -> list[int]:
    """The ranks, in order, where ``flag`` is true, the same list on every rank (one
    all-reduce of a world-sized vector); ``[0]`` or ``[]`` when not distributed.
    ``any_rank`` that can also say where."""
    dist = process_group()
    if dist is None:
        return [0] if flag else []
    import torch

    tensor = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=_device(dist))
    if flag:
        tensor[dist.get_rank()] = 1
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [rank for rank, seen in enumerate(tensor.tolist()) if seen]


def per_rank(value: int) -> list[int]:
    """Every rank's ``value`` (a whole number), in rank order, the same list on every
    rank (one all-reduce of a world-sized vector); ``[value]`` when not distributed.
    NanGuard shares the step where each rank first saw a non-finite value with it."""
    dist = process_group()
    if dist is None:
        return [int(value)]
    import torch

    tensor = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=_device(dist))
    tensor[dist.get_rank()] = int(value)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [int(v) for v in tensor.tolist()]


def all_ranks_mean(value: float) -> float:
    """The mean of ``value`` over all ranks, the same float on every rank (one
    all-reduce, SUM, in float64, then divided by the world size); ``value`` itself
    when not distributed. A NaN on any rank makes the mean NaN."""
    dist = process_group()
    if dist is None:
        return float(value)
    import torch

    tensor = torch.tensor([float(value)], dtype=torch.float64, device=_device(dist))
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item()) / int(dist.get_world_size())


@contextlib.contextmanager
def written_on_rank_zero(where: str, what: str) -> Iterator[None]:
    """Around a write made on rank 0 (the block checks ``is_rank_zero()``): after it,
    one all-reduce is the barrier that also tells every rank whether the write failed.
    Rank 0 then raises its own error, every other rank a HookError naming ``what``.
    Nothing when not distributed."""
    from ..errors import HookError

    failed = True
    try:
        yield
        failed = False
    finally:
        if is_distributed() and any_rank(failed) and not failed:
            raise HookError(f"{where}: rank 0 failed to write {what} (its error says why); "
                            f"stopping every rank.")
