"""An ordinary PyTorch training loop whose stages are join points.

Nothing here knows about logging, progress bars, early stopping or checkpoints:
those are callbacks added from outside (see ``hookwrap demo`` and the README).
Copy it and change what you need; every ``@hw.hookable`` method is a place where
callbacks can read or replace arguments and results.

The only line written for hookwrap's sake besides the decorators is the
``except hw.StopTraining`` in ``fit``: that is how a callback (``EarlyStopping``)
ends the run early.
"""

from __future__ import annotations

from typing import Iterable, TypedDict

import torch
from torch import nn

import hookwrap as hw

Batch = tuple[torch.Tensor, torch.Tensor]


class Metrics(TypedDict):
    """What ``evaluate`` returns; callbacks may monitor any of these keys."""

    val_loss: float
    val_acc: float


class ExampleTrainer(hw.Hookable):
    """``fit -> epoch -> step -> loss / backward / optimizer_step``, and ``evaluate``."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 train_loader: Iterable[Batch], val_loader: Iterable[Batch],
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                 device: str | torch.device = "cpu") -> None:
        self.model = model.to(device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.device = torch.device(device)
        self.metrics: Metrics | None = None
        self.steps = 0
        self.stop_reason: str | None = None

    @hw.hookable
    def fit(self, epochs: int) -> Metrics | None:
        """Train for ``epochs`` epochs, evaluating after each; a callback may end it early."""
        try:
            for index in range(epochs):
                self.epoch(index, self.train_loader)
                self.evaluate(self.val_loader)
        except hw.StopTraining as stop:
            self.stop_reason = str(stop)
        return self.metrics

    @hw.hookable
    def epoch(self, index: int, loader: Iterable[Batch]) -> None:
        self.model.train()
        for batch in loader:
            self.step(batch)
        if self.scheduler is not None:
            self.scheduler.step()

    @hw.hookable
    def step(self, batch: Batch) -> torch.Tensor:
        inputs, targets = (t.to(self.device, non_blocking=True) for t in batch)
        logits = self.model(inputs)
        loss = self.loss(logits, targets)
        self.backward(loss)
        self.optimizer_step()
        self.steps += 1
        return loss.detach()

    @hw.hookable
    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, targets)

    @hw.hookable
    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    @hw.hookable
    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @hw.hookable
    @torch.no_grad()
    def evaluate(self, loader: Iterable[Batch]) -> Metrics:
        self.model.eval()
        total_loss, correct, seen = 0.0, 0, 0
        for inputs, targets in loader:
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            logits = self.model(inputs)
            total_loss += float(nn.functional.cross_entropy(logits, targets, reduction="sum"))
            correct += int((logits.argmax(dim=1) == targets).sum())
            seen += len(targets)
        self.metrics = Metrics(val_loss=total_loss / seen, val_acc=correct / seen)
        return self.metrics


def synthetic_classification(samples: int = 2048, features: int = 20, classes: int = 4,
                             seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels of a task a small MLP can learn: labels from a random
    teacher network, with 5% of them flipped (so the validation loss levels off)."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, features, generator=gen)
    teacher = torch.randn(features, classes, generator=gen)
    labels = (torch.tanh(inputs @ teacher) + 0.3 * torch.randn(samples, classes, generator=gen)).argmax(1)
    flip = torch.rand(samples, generator=gen) < 0.05
    labels[flip] = torch.randint(0, classes, (int(flip.sum()),), generator=gen)
    return inputs, labels


def make_run(device: str = "cpu", seed: int = 0, batch_size: int = 32,
             trainer_class: type[ExampleTrainer] = ExampleTrainer) -> ExampleTrainer:
    """A small MLP, its optimizer and scheduler, and synthetic train/validation data."""
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(seed)
    inputs, labels = synthetic_classification(seed=seed)
    split = int(0.8 * len(inputs))
    train = DataLoader(TensorDataset(inputs[:split], labels[:split]), batch_size=batch_size,
                       shuffle=True, generator=torch.Generator().manual_seed(seed))
    val = DataLoader(TensorDataset(inputs[split:], labels[split:]), batch_size=256)
    model = nn.Sequential(nn.Linear(inputs.shape[1], 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, int(labels.max()) + 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=30)
    return trainer_class(model, optimizer, train, val, scheduler=scheduler, device=device)
