"""One process of tests/integrations/test_fabric.py's two-rank run (spawned:
importable by name): a Fabric DDP loop on gloo where a callback stops on rank 1
alone; with ``stop="flag"`` every rank leaves the loop at the same epoch (a rank
leaving alone would leave the other waiting in the next gradient all-reduce)."""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any

from tests._ranks import rank_main


def run(rank: int, world_size: int, init_file: str, out_dir: str, no_extensions: str, timeout_s: float) -> None:
    # Fabric's default cluster environment reads the ranks from these; the process
    # group rank_main made is the one Fabric's DDP strategy uses.
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world_size))
    rank_main(rank, world_size, init_file, out_dir, no_extensions, timeout_s, functools.partial(_train, rank))


def _train(rank: int) -> dict[str, Any]:
    import torch
    from lightning.fabric import Fabric

    import hookwrap as hw
    from hookwrap.integrations import fabric as hw_fabric

    warnings.filterwarnings("ignore", module="lightning")
    with hw_fabric.weave(stop="flag"):
        fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
        fabric.launch()
        torch.manual_seed(0)
        layer = torch.nn.Linear(4, 1)
        model, optimizer = fabric.setup(layer, torch.optim.SGD(layer.parameters(), lr=0.1))
        evaluations = []

        def stop_on_rank_1(self: Any, return_value: dict[str, Any]) -> dict[str, Any]:
            evaluations.append(return_value["val_loss"])
            if rank == 1 and len(evaluations) == 2:
                raise hw.StopTraining("rank 1 alone")
            return return_value

        hw.after(fabric, "evaluate", stop_on_rank_1)
        g = torch.Generator().manual_seed(rank)
        epochs = 0
        for epoch in range(1, 6):
            for _ in range(4):
                x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
                fabric.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()  # DDP's all-reduce of the gradients: a collective
                optimizer.zero_grad()
            fabric.call("on_validation_end", val_loss=float(epoch))
            epochs = epoch
            if hw_fabric.should_stop(fabric):
                break
        return {"epochs": epochs, "compiled": hw.USING_EXTENSION,
                "weight": [float(v) for v in layer.weight.detach().flatten()]}
