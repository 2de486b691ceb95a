"""A run that survives an exception or a termination signal: the loop of
tests/torch/test_survive.py, and the script its signal test runs in child
processes (``python -m tests.torch._survive_worker``).

The loop counts steps, not epochs, and each step draws its own batch from torch's
global RNG, uses dropout, scales its loss by a draw from Python's ``random`` and
decays the learning rate with a per-step scheduler; EarlyStopping watches an
evaluation every ``EVAL_EVERY`` steps. So it can continue after any completed
step, and it reaches the weights of a run that never stopped only if the model,
optimizer, scheduler, counters, RNG states and callback state of that step all
come back.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any, Callable

STEPS = 24
EVAL_EVERY = 4
BATCH = 8
SAMPLES = 48


class Failed(RuntimeError):
    """A step fails after its forward and backward (its RNG draws made), before its
    optimizer step: the model still holds the previous step's weights."""


def build(hw: Any, ht: Any, ckpt_dir: str, fail_at: int | None = None,
          after_step: Callable[[int], None] | None = None, wrap: Callable[[Any], Any] | None = None,
          device: str = "cpu", **checkpoint: Any) -> Any:
    """A fresh run with ``Checkpoint(ckpt_dir, **checkpoint)`` attached last; seeded
    the same every time it is built. Step ``fail_at`` (1-based) raises ``Failed``;
    ``after_step(n)`` runs after step ``n`` completes; ``wrap(model)`` (FSDP's
    ``fully_shard``) before the optimizer is made."""
    import torch
    from torch import nn

    torch.manual_seed(1000)
    random.seed(0)
    gen = torch.Generator().manual_seed(7)
    teacher = torch.randn(4, 1, generator=gen)
    inputs = torch.randn(SAMPLES, 4, generator=gen)
    targets = inputs @ teacher + 0.5 * torch.randn(SAMPLES, 1, generator=gen)
    inputs, targets = inputs.to(device), targets.to(device)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1)).to(device)
    if wrap is not None:
        model = wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
            self.steps = 0  # completed

        @hw.hookable
        def fit(self, total: int, start: int = 0) -> None:
            try:
                for index in range(start, total):
                    self.step(index)
                    if (index + 1) % EVAL_EVERY == 0:
                        self.evaluate()
            except hw.StopTraining:
                pass

        @hw.hookable
        def step(self, index: int) -> Any:
            self.model.train()
            rows = torch.randint(0, SAMPLES, (BATCH,))  # the batch: torch's global RNG
            self.optimizer.zero_grad()
            scale = 1.0 + 0.2 * random.random()
            loss = nn.functional.mse_loss(self.model(inputs[rows]), targets[rows]) * scale
            loss.backward()
            if index + 1 == fail_at:
                raise Failed(f"step {index + 1} failed")
            self.optimizer.step()
            self.scheduler.step()
            self.steps += 1
            if after_step is not None:
                after_step(self.steps)
            return loss.detach()

        @hw.hookable
        def evaluate(self) -> dict[str, float]:
            self.model.eval()
            with torch.no_grad():
                return {"val_loss": float(nn.functional.mse_loss(self.model(inputs), targets))}

    loop = Loop()
    loop.add_callback(ht.EarlyStopping("val_loss", patience=50))
    loop.checkpoint = ht.Checkpoint(ckpt_dir, **checkpoint)
    loop.add_callback(loop.checkpoint)
    return loop


def resume(loop: Any, path: str) -> int:
    """Restore ``loop`` from ``path`` of its checkpoint; the step to continue at."""
    state = loop.checkpoint.resume(loop, path)
    loop.steps = int(state["step"])
    return loop.steps


def main(argv: list[str]) -> None:
    """``DIR PAUSE_AT OUT [resume]``: train on SIGTERM's watch (``on_signal``); after
    step PAUSE_AT print ``reached PAUSE_AT`` and wait for a line on stdin (the test
    sends the signal, then the line); with ``resume``, continue from ``signal.pt``.
    A run that finishes saves its weights to OUT."""
    import signal

    import torch

    import hookwrap as hw
    import hookwrap.torch as ht

    folder, pause_at, out = argv[0], int(argv[1]), argv[2]

    def after_step(n: int) -> None:
        if n == pause_at:
            print(f"reached {n}", flush=True)
            sys.stdin.readline()

    loop = build(hw, ht, folder, after_step=after_step, on_signal=(signal.SIGTERM,))
    start = resume(loop, "signal") if argv[3:] == ["resume"] else 0
    print(f"start {start}", flush=True)
    loop.fit(STEPS, start)
    torch.save(loop.model.state_dict(), out)
    print(f"done {loop.steps}", flush=True)


def sharded(rank: int, world_size: int, init_file: str, out_dir: str, no_extensions: str,
            timeout_s: float, device: str = "cpu") -> None:
    """One rank of tests/torch/test_survive.py's FSDP tests: the loop's model
    ``fully_shard``-ed over the ranks (gloo on the CPU, NCCL on ``device="cuda"``,
    one GPU a rank), saved by Checkpoint in shards."""
    from tests._ranks import rank_main

    def train() -> dict[str, Any]:
        import torch
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        import hookwrap as hw
        import hookwrap.torch as ht

        mesh = init_device_mesh(device, (world_size,))

        def wrap(model: Any) -> Any:
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            return fully_shard(model, mesh=mesh)

        def full(loop: Any) -> tuple[dict[str, Any], dict[str, Any]]:
            options = StateDictOptions(full_state_dict=True)
            return get_state_dict(loop.model, loop.optimizer, options=options)  # type: ignore[return-value]

        def equal(a: Any, b: Any) -> bool:
            if isinstance(a, dict):
                return isinstance(b, dict) and set(a) == set(b) and all(equal(a[k], b[k]) for k in a)
            if isinstance(a, (list, tuple)):
                return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
            if isinstance(a, torch.Tensor):
                return isinstance(b, torch.Tensor) and torch.equal(a, b)
            return bool(a == b)

        folder = os.path.join(out_dir, "run")
        straight = build(hw, ht, os.path.join(out_dir, "straight"), wrap=wrap, device=device)
        straight.fit(STEPS)
        killed = build(hw, ht, folder, wrap=wrap, device=device, fail_at=15, every_n_steps=6)
        try:
            killed.fit(STEPS)
        except Failed:
            pass
        saved_model, saved_optimizer = full(killed)  # after step 14: last.pt holds step 12
        loaded = build(hw, ht, folder, wrap=wrap, device=device, every_n_steps=6)
        at = resume(loaded, os.path.join(folder, "step=12.pt"))
        resumed = build(hw, ht, folder, wrap=wrap, device=device, every_n_steps=6)
        start = resume(resumed, "last")
        resumed.fit(STEPS, start)
        files = sorted(os.listdir(folder)) if rank == 0 else []
        model_now, optimizer_now = full(loaded)
        killed_twelve = build(hw, ht, os.path.join(out_dir, "twelve"), wrap=wrap, device=device)
        killed_twelve.fit(12)
        model_twelve, optimizer_twelve = full(killed_twelve)
        return {"sharded": loaded.checkpoint.is_sharded(loaded.model), "at": at, "start": start,
                "files": files, "shards": sorted(os.listdir(os.path.join(folder, "last.pt"))) if rank == 0 else [],
                "round_trip_model": equal(model_now, model_twelve),
                "round_trip_optimizer": equal(optimizer_now, optimizer_twelve),
                "not_the_later_state": not equal(model_now, saved_model),
                "resumed_equals_straight": equal(full(resumed)[0], full(straight)[0])}

    rank_main(rank, world_size, init_file, out_dir, no_extensions, timeout_s, train,
              "nccl" if device == "cuda" else "gloo")


def signalled(rank: int, world_size: int, init_file: str, out_dir: str, no_extensions: str,
              timeout_s: float) -> None:
    """One rank of tests/torch/test_survive.py's distributed signal test: a DDP run
    watching SIGUSR1, which only rank 1 gets, after its step 5."""
    from tests._ranks import rank_main

    def train() -> dict[str, Any]:
        import signal

        import torch
        from torch.nn.parallel import DistributedDataParallel

        import hookwrap as hw
        import hookwrap.torch as ht

        handed_on: list[int] = []

        def after_step(n: int) -> None:
            if n == 5 and rank == 1:
                signal.raise_signal(signal.SIGUSR1)

        previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handed_on.append(signum))
        try:
            loop = build(hw, ht, os.path.join(out_dir, "run"), after_step=after_step, wrap=DistributedDataParallel,
                         on_signal="SIGUSR1")
            loop.fit(STEPS)
        finally:
            signal.signal(signal.SIGUSR1, previous)
        saved = torch.load(os.path.join(out_dir, "run", "signal.pt"), weights_only=True)
        return {"handed_on": handed_on, "saved_step": saved["step"], "steps": loop.steps,
                "weights": [p.detach().flatten().tolist() for p in loop.model.parameters()]}

    rank_main(rank, world_size, init_file, out_dir, no_extensions, timeout_s, train)


if __name__ == "__main__":
    os.environ.setdefault("HOOKWRAP_NO_EXTENSIONS", "")
    main(sys.argv[1:])
