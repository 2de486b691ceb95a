"""The demo's training step (examples/trainer.py, MLP 20-64-64-4, batch 32, CPU, one
thread) with and without the demo's per-step callbacks, with pytest-benchmark.

Run: ``python -m pytest bench/bench_demo_step.py --benchmark-enable``; compare the
two rows of one run. The callbacks' own work is included (NanGuard and
MetricsLogger read the loss back), as it is in ``hookwrap demo``'s overhead line.
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch", reason="the demo step needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice


def _attach_demo_callbacks(trainer, ht, tmp_path):
    log = ht.MetricsLogger(tmp_path / "metrics.csv", every=10, tensorboard=False)
    for callback in (ht.NanGuard(), ht.EarlyStopping("val_loss", patience=3),
                     ht.StepTimer(), ht.GradNorm(every=50, logger=log), ht.LRMonitor(logger=log), log):
        trainer.add_callback(callback)
    trainer.before("loss", lambda self, targets: targets)


@pytest.mark.parametrize("callbacks", ["without callbacks", "with the demo's callbacks"])
def bench_demo_step(benchmark, hw_module, tmp_path, callbacks):
    trainer_module = importlib.import_module("hookwrap.examples.trainer")
    torch.set_num_threads(1)
    trainer = trainer_module.make_run()
    if callbacks != "without callbacks":
        _attach_demo_callbacks(trainer, importlib.import_module("hookwrap.torch"), tmp_path)
    batch = next(iter(trainer.train_loader))
    first = float(trainer.step(batch))
    benchmark(trainer.step, batch)
    assert first > 0 and trainer.steps >= 2  # it really trains
    hw_module.callback_state(trainer)  # steps outside fit: settle what they hold (else reported at exit)
