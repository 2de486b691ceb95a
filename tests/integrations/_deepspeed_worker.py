"""One DeepSpeed scenario in a process of its own (DeepSpeed sets up torch.distributed,
one process on its CPU accelerator), printing its results as JSON on the last line.

    python _deepspeed_worker.py hf STAGE ACCUMULATE        HF Trainer + the transformers preset
    python _deepspeed_worker.py hf_nan STAGE ACCUMULATE    ... with a NaN loss in update 3
    python _deepspeed_worker.py engine STAGE ACCUMULATE    a DeepSpeedEngine loop + the deepspeed preset
    python _deepspeed_worker.py accelerate STAGE ACCUMULATE  an accelerate loop on DeepSpeed + its preset
    python _deepspeed_worker.py resume STAGE ACCUMULATE    the engine loop saved at update 2, resumed

Tiny models built from configs, synthetic data: nothing is downloaded."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import tempfile
import warnings
from typing import Any

with socket.socket() as _free:  # a port of this process's own: scenarios run side by side
    _free.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free.getsockname()[1]), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1", DS_ACCELERATOR="cpu")

import torch  # noqa: E402

import hookwrap as hw  # noqa: E402
import hookwrap.torch as ht  # noqa: E402

UPDATES = 4


def hf(stage: int, accumulate: int, nan: bool = False) -> dict[str, Any]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _tiny_hf import tiny_trainer

    from hookwrap.integrations import transformers as hw_hf

    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": stage}}
    hw_hf.weave()
    trainer = tiny_trainer(tempfile.mkdtemp(), steps=UPDATES, gradient_accumulation_steps=accumulate,
                           logging_strategy="steps", logging_steps=1, deepspeed=config)
    updates: list[int] = []
    hw.after(trainer, "optimizer_step", lambda self: updates.append(self.state.global_step))
    norm = ht.GradNorm()
    hw.add_callback(trainer, norm)
    result: dict[str, Any] = {}
    if nan:
        batches: list[int] = []

        def poison(self: Any, return_value: Any) -> Any:  # the first batch of update 3
            batches.append(1)
            return return_value * float("nan") if len(batches) == 2 * accumulate + 1 else return_value

        hw.after(trainer, "loss", poison)
        hw.add_callback(trainer, ht.NanGuard(sync=True))
        try:
            trainer.train()
        except ht.NonFiniteError as exc:
            result["nan"] = str(exc)
        return result
    trainer.train()
    result.update(
        engine=type(trainer.model_wrapped).__name__,
        updates=updates,
        global_step=trainer.state.global_step,
        grad_norm=norm.history,
        hf_grad_norm=[(row["step"], row["grad_norm"]) for row in trainer.state.log_history if "grad_norm" in row])
    return result


def engine(stage: int, accumulate: int) -> dict[str, Any]:
    import deepspeed

    from hookwrap.integrations import deepspeed as hw_deepspeed

    hw_deepspeed.weave()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": accumulate,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
              "gradient_clipping": 1.0}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    updates: list[int] = []
    hw.after(engine, "optimizer_step", lambda self: updates.append(self.global_steps))
    losses: list[float] = []
    hw.before(engine, "backward", lambda self, loss: (losses.append(float(loss)), loss)[1])
    norm = ht.GradNorm()
    hw.add_callback(engine, norm)
    deepspeeds: list[tuple[int, float]] = []
    gen = torch.Generator().manual_seed(1)
    for _ in range(UPDATES * accumulate):
        x = torch.randn(4, 8, generator=gen)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        boundary = engine.is_gradient_accumulation_boundary()
        if boundary and not stage:  # no ZeRO: the parameters' gradients, before DeepSpeed clips them
            by_hand = torch.stack([p.grad.norm() for p in model.parameters()]).norm()
        engine.step()
        if boundary:
            deepspeeds.append((engine.global_steps, float(engine.get_global_grad_norm() if stage else by_hand)))
    clip = None
    hw.add_callback(engine, ht.GradClip(1.0))
    try:
        engine.backward(engine(torch.randn(4, 8, generator=gen)).pow(2).mean())
    except hw.HookError as exc:
        clip = str(exc)
    return {"updates": updates, "global_steps": engine.global_steps, "grad_norm": norm.history,
            "deepspeed_grad_norm": deepspeeds, "backward_losses": len(losses), "clip": clip,
            "using_extension": hw.USING_EXTENSION}


def autocast(stage: int, accumulate: int) -> dict[str, Any]:
    """ZeRO 0 with float16 torch_autocast: DeepSpeed scales the loss with a GradScaler of
    its own and p.grad holds the scaled gradients until step(). (Its CPU accelerator
    says it has no float16 where oneDNN lacks it: told it has, for this scenario.)"""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    from hookwrap.integrations import deepspeed as hw_deepspeed

    accelerator = type(get_accelerator())
    accelerator.is_fp16_supported = lambda self: True  # type: ignore[method-assign]
    accelerator.supported_dtypes = lambda self: [torch.float, torch.half, torch.bfloat16]  # type: ignore[method-assign]
    hw_deepspeed.weave()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": accumulate,
              "zero_optimization": {"stage": stage}, "torch_autocast": {"enabled": True, "dtype": "torch.float16"}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                      config=config)
    norm = ht.GradNorm()
    hw.add_callback(engine, norm)
    by_hand: list[tuple[int, float]] = []
    for i in range(UPDATES * accumulate):
        engine.backward(engine(torch.randn(4, 8, generator=torch.Generator().manual_seed(i))).pow(2).mean())
        boundary = engine.is_gradient_accumulation_boundary()
        if boundary:
            scale = engine.torch_autocast_z0_gradscaler.get_scale()
            grads = torch.stack([p.grad.float().norm() for p in model.parameters()]).norm()
        engine.step()
        if boundary:
            by_hand.append((engine.global_steps, float(grads) / scale))
    clip = None
    hw.add_callback(engine, ht.GradClip(1.0))
    try:
        engine.backward(engine(torch.randn(4, 8)).pow(2).mean())
    except hw.HookError as exc:
        clip = str(exc)
    return {"clip": clip, "grad_norm": [(step, value) for step, value in norm.history if math.isfinite(value)],
            "by_hand": [(step, value) for step, value in by_hand if math.isfinite(value)]}


def resume(stage: int, accumulate: int) -> dict[str, Any]:
    """6 updates straight, and 2 then save_checkpoint, then a new engine that
    load_checkpoint's and makes updates 3 to 6. GradNorm(every=3) measures at updates 3
    and 6 when its count goes on from the checkpoint (at 5 only, were it lost)."""
    import deepspeed

    from hookwrap.integrations import deepspeed as hw_deepspeed

    hw_deepspeed.weave()
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": accumulate,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}

    def make() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                          config=config)
        norm = ht.GradNorm(every=3)
        hw.add_callback(engine, norm)
        return engine, norm

    def train(engine: Any, first: int, last: int) -> None:  # updates first..last, the same batches
        for i in range((first - 1) * accumulate, last * accumulate):
            engine.backward(engine(torch.randn(4, 8, generator=torch.Generator().manual_seed(i))).pow(2).mean())
            engine.step()

    folder = tempfile.mkdtemp()
    straight, straight_norm = make()
    train(straight, 1, 6)
    first, _ = make()
    train(first, 1, 2)
    first.save_checkpoint(folder)
    resumed, resumed_norm = make()
    resumed.load_checkpoint(folder)
    train(resumed, 3, 6)
    weights = [torch.equal(a, b) for a, b in zip(straight.module.parameters(), resumed.module.parameters())]
    return {"straight": straight_norm.history, "resumed": resumed_norm.history, "same_weights": all(weights),
            "files": sorted(os.listdir(os.path.join(folder, "global_step2")))}


def accelerate_loop(stage: int, accumulate: int) -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    from hookwrap.integrations import accelerate as hw_accelerate

    hw_accelerate.weave()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    plugin = DeepSpeedPlugin(zero_stage=stage, gradient_accumulation_steps=accumulate, gradient_clipping=1.0)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(4 * UPDATES * accumulate, 8, generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05), loader)
    updates: list[int] = []
    hw.after(accelerator, "optimizer_step", lambda self: updates.append(len(updates) + 1))
    norm = ht.GradNorm(model=model)
    hw.add_callback(accelerator, norm)
    deepspeeds: list[tuple[int, float | None]] = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", hw.HookwrapWarning)
        for (x,) in loader:
            with accelerator.accumulate(model):
                loss = model(x).pow(2).mean()
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    engine = accelerator.deepspeed_engine_wrapped.engine
                    value = engine.get_global_grad_norm()  # None without ZeRO
                    deepspeeds.append((engine.global_steps, None if value is None else float(value)))
                optimizer.step()
                optimizer.zero_grad()
    return {"updates": updates, "grad_norm": norm.history, "deepspeed_grad_norm": deepspeeds,
            "said": [str(w.message) for w in said if issubclass(w.category, hw.HookwrapWarning)],
            "engine": type(accelerator.deepspeed_engine_wrapped.engine).__name__}


if __name__ == "__main__":
    scenario, stage, accumulate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if scenario == "engine":
        out = engine(stage, accumulate)
    elif scenario == "resume":
        out = resume(stage, accumulate)
    elif scenario == "autocast":
        out = autocast(stage, accumulate)
    elif scenario == "accelerate":
        out = accelerate_loop(stage, accumulate)
    else:
        out = hf(stage, accumulate, nan=scenario == "hf_nan")
    print(json.dumps(out))
