"""A Lightning Fabric training loop as Fabric's docs write one, on synthetic data
(8 batches an epoch), for `hookwrap run --preset fabric` (it knows nothing of hookwrap)."""

from __future__ import annotations

import argparse
import warnings

import torch
from lightning.fabric import Fabric


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", module="lightning")
    fabric = Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 1)
    model, optimizer = fabric.setup(layer, torch.optim.SGD(layer.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(8)]
    step = 0
    for epoch in range(args.epochs):
        for x, y in data:
            loss = torch.nn.functional.mse_loss(model(x), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            fabric.call("on_train_batch_end", loss=loss)
        with torch.no_grad():
            val_loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in data) / len(data)
        print(f"val_loss {step} {float(val_loss):.6f}")
        fabric.call("on_validation_end", val_loss=val_loss)
    fabric.call("on_train_end")


if __name__ == "__main__":
    main()
