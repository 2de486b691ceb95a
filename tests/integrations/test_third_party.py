"""Third-party trainers from PyPI, woven without editing them (the ``thirdparty``
extra; CI installs it and runs these with ``-m third_party``): transformers'
``Trainer`` on a tiny GPT-2 built from a config, and pytorch-ignite's ``Engine``,
on synthetic data. Callbacks change what they do; ``remove()`` brings back the
original behaviour exactly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytestmark = pytest.mark.third_party

torch = pytest.importorskip("torch", reason="needs the torch extra")


@pytest.fixture
def hf() -> Any:
    return pytest.importorskip("transformers", reason="needs the thirdparty extra")


def tiny_trainer(tmp_path: Any, steps: int) -> Any:
    from tests.integrations._tiny_hf import tiny_trainer as make  # imports transformers: after the skip

    return make(tmp_path, steps=steps)


def _weights(trainer: Any) -> Any:
    return torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])


def test_transformers_trainer_woven_scaled_counted_and_restored(hw, hf, tmp_path):
    original = vars(hf.Trainer)["compute_loss"], vars(hf.Trainer)["training_step"]
    with hw.weave(hf.Trainer, "compute_loss", "training_step"):
        trainer = tiny_trainer(tmp_path, steps=3)
        steps, losses = [], []
        hw.after(trainer, "training_step", lambda self, return_value: steps.append(float(return_value)) or return_value)

        def scale_loss(self, return_value):  # a loss scaled to zero: nothing is learned
            losses.append(float(return_value.detach()))
            return return_value * 0.0

        hw.after(trainer, "compute_loss", scale_loss)
        before = _weights(trainer)
        trainer.train()
        assert len(steps) == 3 and len(losses) == 3 and all(loss > 0 for loss in losses)
        assert steps == [0.0, 0.0, 0.0]  # training_step saw the scaled loss
        assert torch.equal(_weights(trainer), before)
    assert (vars(hf.Trainer)["compute_loss"], vars(hf.Trainer)["training_step"]) == original
    trainer = tiny_trainer(tmp_path, steps=3)  # un-woven: the original trainer learns again
    before = _weights(trainer)
    trainer.train()
    assert not torch.equal(_weights(trainer), before)


def test_transformers_trainer_stops_on_a_nan_loss(hw, hf, tmp_path):
    from hookwrap.torch import NanGuard, NonFiniteError

    with hw.weave(hf.Trainer, "compute_loss"):
        trainer = tiny_trainer(tmp_path, steps=5)
        calls = []

        def poison(self, return_value):
            calls.append(1)
            return return_value * float("nan") if len(calls) == 2 else return_value

        hw.after(trainer, "compute_loss", poison)
        # A woven class is not Hookable (no add_callback): a shipped callback attaches
        # globally, for the block.
        with NanGuard(events="compute_loss", step_event=None, sync=True):  # no epoch/fit join point
            with pytest.raises(NonFiniteError, match=r"'post-compute_loss' returned nan"):
                trainer.train()
    assert len(calls) == 2  # it stopped at the poisoned step


def test_weaving_transformers_by_name_before_it_is_imported(hw, tmp_path):
    pytest.importorskip("transformers", reason="needs the thirdparty extra")
    script = textwrap.dedent("""
        import sys
        import hookwrap as hw
        handle = hw.weave("transformers.trainer:Trainer", "compute_loss")
        assert "transformers" not in sys.modules and not handle.applied, handle
        from transformers import Trainer
        assert handle.applied, handle
        hw.before(Trainer, "compute_loss", lambda self, model: model)
        print(hw.describe(Trainer, "pre-compute_loss").chains["pre-compute_loss"][0].source.tier)
    """)
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "class"


def test_ignite_engine_woven_changes_the_run_and_is_restored(hw):
    engine_module = pytest.importorskip("ignite.engine", reason="needs the thirdparty extra")
    Engine, Events = engine_module.Engine, engine_module.Events

    def process(engine: Any, batch: Any) -> Any:
        return float(batch.sum())

    def iterations(engine: Any) -> int:
        counted = []
        engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: counted.append(e.state.iteration))
        engine.run([torch.ones(2)] * 4, max_epochs=3)
        return len(counted)

    original = vars(Engine)["run"]
    with hw.weave(Engine, "run"):
        engine = Engine(process)
        runs = []
        hw.before(engine, "run", lambda self, max_epochs: 1)  # replaces the argument
        hw.after(engine, "run", lambda self, return_value: runs.append(return_value.epoch) or return_value)
        assert iterations(engine) == 4  # one epoch of 4 batches, not three
        assert runs == [1]
        assert iterations(Engine(process)) == 12  # another engine: its own run, untouched
    assert vars(Engine)["run"] is original
    assert iterations(Engine(process)) == 12
