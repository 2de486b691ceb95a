"""DeepSpeed (0.19, its CPU accelerator, one process): HF's Trainer on ZeRO 1 to 3 with
the transformers preset, and a DeepSpeedEngine loop with the deepspeed preset, compared
with DeepSpeed and HF themselves on the same run: ``optimizer_step`` once per update
(DeepSpeed updates inside ``backward`` under HF, at ``engine.step()``'s accumulation
boundary in a loop), GradNorm equal to DeepSpeed's norm (HF's ``grad_norm``) and
numbered by update, NanGuard naming the update, GradClip refused where DeepSpeed holds
the gradients. Each scenario runs in a process of its own (_deepspeed_worker.py):
DeepSpeed sets up torch.distributed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.third_party
pytest.importorskip("deepspeed", reason="needs deepspeed (DS_BUILD_OPS=0 pip install --no-build-isolation "
                                        "deepspeed==0.19.8 torch==2.13.0; .ci/run installs it)")

WORKER = Path(__file__).resolve().parent / "_deepspeed_worker.py"
UPDATES = 4


def run(*args: Any, pure: bool = False) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("HOOKWRAP_NO_EXTENSIONS", None)
    if pure:
        env["HOOKWRAP_NO_EXTENSIONS"] = "1"
    done = subprocess.run([sys.executable, str(WORKER), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def same(ours: list[list[float]], theirs: list[list[float]]) -> bool:
    return [step for step, _ in ours] == [step for step, _ in theirs] and all(
        math.isclose(a, b, rel_tol=1e-5) for (_, a), (_, b) in zip(ours, theirs))


@pytest.mark.parametrize(("stage", "accumulate"), [(1, 2), (2, 2), (3, 2), (2, 1)])
def test_hf_trainer_on_deepspeed_counts_its_updates_and_logs_its_norm(stage, accumulate):
    """The Trainer's optimizer.step() is DeepSpeedOptimizerWrapper's no-op (the update ran
    inside backward): optimizer_step still fires once per update, as HF's
    on_optimizer_step does, and GradNorm reports HF's grad_norm, update by update (it
    recorded nothing under ZeRO 2, and the first batch's norm under ZeRO 1)."""
    out = run("hf", stage, accumulate)
    assert out["engine"] == "DeepSpeedEngine"
    assert out["updates"] == list(range(UPDATES)) and out["global_step"] == UPDATES
    assert len(out["hf_grad_norm"]) == UPDATES
    assert same(out["grad_norm"], out["hf_grad_norm"]), (out["grad_norm"], out["hf_grad_norm"])


def test_nan_guard_on_hf_deepspeed_names_the_update():
    out = run("hf_nan", 2, 2)
    assert "'post-loss' returned nan at step 3 " in out["nan"]


@pytest.mark.parametrize(("stage", "accumulate", "pure"),
                         [(0, 2, False), (1, 2, False), (2, 2, False), (3, 2, False), (2, 1, False), (2, 2, True)])
def test_a_deepspeed_engine_loop_under_the_preset(stage, accumulate, pure):
    """engine.step() runs every micro-batch; optimizer_step fires at the accumulation
    boundaries only, numbered by engine.global_steps. Under ZeRO GradNorm is DeepSpeed's
    norm of each update and GradClip is refused naming gradient_clipping; without ZeRO
    it is the norm of p.grad before DeepSpeed's step, and GradClip clips. backward,
    hidden behind DeepSpeed's (*args, **kwargs) profiling wrapper, gives callbacks its
    loss on every call, on both dispatch twins."""
    out = run("engine", stage, accumulate, pure=pure)
    assert out["using_extension"] == (not pure)
    assert out["updates"] == list(range(1, UPDATES + 1)) and out["global_steps"] == UPDATES
    assert out["backward_losses"] == UPDATES * accumulate + 1
    assert same(out["grad_norm"], out["deepspeed_grad_norm"]), (out["grad_norm"], out["deepspeed_grad_norm"])
    if stage:
        assert "GradClip on DeepSpeedEngine" in out["clip"] and "gradient_clipping" in out["clip"]
    else:
        assert out["clip"] is None


def test_grad_norm_without_zero_under_float16_autocast_is_unscaled():
    """ZeRO 0 with torch_autocast float16: p.grad is scaled by DeepSpeed's own GradScaler
    until step(); GradNorm divides by its scale (it reported the norm times 2**15), and
    GradClip, which would clip the scaled gradients (the update shrunk by the scale), is
    refused naming gradient_clipping."""
    out = run("autocast", 0, 2)
    assert "GradClip on DeepSpeedEngine" in out["clip"] and "gradient_clipping" in out["clip"]
    assert len(out["by_hand"]) >= UPDATES - 1
    assert same(out["grad_norm"], out["by_hand"]), (out["grad_norm"], out["by_hand"])


@pytest.mark.parametrize(("stage", "accumulate"), [(1, 2), (2, 2), (3, 1)])
def test_an_accelerate_loop_on_deepspeed_counts_its_updates_and_logs_its_norm(stage, accumulate):
    """accelerate's DeepSpeedPlugin: accelerator.backward runs the update at the
    boundary and optimizer.step() is a no-op wrapper that accelerate's DeepSpeed prepare
    made (not prepare_optimizer): optimizer_step fires once per update, and GradNorm
    is DeepSpeed's norm (what accelerator.clip_grad_norm_ returns there)."""
    out = run("accelerate", stage, accumulate)
    assert out["engine"] == "DeepSpeedEngine"
    assert out["updates"] == list(range(1, UPDATES + 1))
    assert same(out["grad_norm"], out["deepspeed_grad_norm"]), (out["grad_norm"], out["deepspeed_grad_norm"])


@pytest.mark.parametrize("stage", [0, 2])
def test_the_callbacks_state_rides_on_deepspeeds_checkpoint(stage):
    """engine.save_checkpoint at update 2 writes hookwrap_callbacks.pt into the tag's
    folder; a new engine's load_checkpoint gives it back: GradNorm(every=3) measures at
    updates 3 and 6 with the uninterrupted run's norms (it would measure at 5 afresh),
    and the weights are the uninterrupted run's."""
    out = run("resume", stage, 2)
    assert "hookwrap_callbacks.pt" in out["files"]
    assert [step for step, _ in out["straight"]] == [3, 6]
    assert same(out["resumed"], out["straight"]) and out["same_weights"]


def test_without_zero_under_accelerate_grad_norm_says_deepspeed_computed_none():
    """ZeRO stage 0 under accelerate: DeepSpeed steps inside backward and computes no
    norm (get_global_grad_norm() is None, what accelerate and HF log). GradNorm records
    none and says so once, naming the stage; the updates are still counted."""
    out = run("accelerate", 0, 2)
    assert out["updates"] == list(range(1, UPDATES + 1))
    assert out["grad_norm"] == [] and all(value is None for _, value in out["deepspeed_grad_norm"])
    assert len(out["said"]) == 1 and "computed no norm" in out["said"][0] and "ZeRO stage 1" in out["said"][0]
