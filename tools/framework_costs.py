"""What a training step costs with each framework's own callback system and with
hookwrap's preset for it, in instructions (callgrind), on the same hook points.

    python tools/framework_costs.py [--only lightning,ignite,transformers] [--json PATH]

For each framework, a tiny run (a ``Linear(32, 8)`` on SGD, batches of 16, on
the CPU, no logger, no checkpoint, no progress bar) is counted per training step:

* ``none``: the framework alone;
* ``native K``: K no-op callbacks of the framework's own system on the hook
  points below (Lightning ``Callback``, HF ``TrainerCallback``, ignite event
  handlers), K = 1 and 8;
* ``preset K``: hookwrap's preset woven, with K no-op ``hw.Callback`` s on the
  same points attached to the trainer (K = 0, 1, 8), in the compiled dispatch and
  in the pure twin.

=============  ==================================================  ===================================
framework      its own hook points                                 hookwrap's
=============  ==================================================  ===================================
lightning      on_train_batch_start/_end, on_before/after_backward,  pre/post-step, pre/post-backward,
               on_before_optimizer_step                              pre-optimizer_step
ignite         ITERATION_STARTED, ITERATION_COMPLETED                pre-step, post-step
transformers   on_step_begin, on_pre_optimizer_step,                 pre-step, pre-optimizer_step,
               on_optimizer_step, on_step_end                        post-optimizer_step, post-step
=============  ==================================================  ===================================

Each run happens in its own process under ``valgrind --tool=callgrind
--instr-atstart=no``: instructions are counted only inside a window that the
training data's ``__getitem__`` opens at step WARMUP and closes STEPS steps later
(one item per step), through callgrind's client requests in a small C helper
compiled here with the system's C compiler. Imports and start-up are not
counted, and the garbage collector is off inside the window (whether a
collection falls into it depends on the allocations before it, and one moves a
step's count by thousands). The framework's own count moves by up to a few
thousand instructions a step with the process's memory layout (hash tables of
objects keyed by address): each variant is counted in ``--repeats`` layouts (an
environment variable of another length each) and the median kept; read
differences within that spread (printed for each framework alone) as zero.

``--json docs/performance/framework-costs.json``, then ``python
tools/perf_tables.py --write docs/performance.md``, for the performance page's
table. Needs valgrind, its headers and a C compiler, and lightning,
pytorch-ignite and transformers (the ``thirdparty`` extra). A developer harness:
not part of the installed package.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

WARMUP, STEPS = 30, 200
FRAMEWORKS = ("lightning", "ignite", "transformers")
NATIVE_K, PRESET_K = (1, 8), (0, 1, 8)
PADS = (0, 17, 41, 73, 111)  # environment padding: one memory layout per repeat
HOOKS = {  # the framework's hook points, hookwrap's events on the same points
    "lightning": (("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
                   "on_before_optimizer_step"),
                  ("pre-step", "post-step", "pre-backward", "post-backward", "pre-optimizer_step")),
    "ignite": (("ITERATION_STARTED", "ITERATION_COMPLETED"), ("pre-step", "post-step")),
    "transformers": (("on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end"),
                     ("pre-step", "pre-optimizer_step", "post-optimizer_step", "post-step")),
}

_HELPER = r"""
#include <valgrind/callgrind.h>
void window_open(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void window_close(void) { CALLGRIND_DUMP_STATS_AT("window"); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def build_helper(directory: Path) -> Path:
    source, library = directory / "window.c", directory / "window.so"
    source.write_text(_HELPER)
    compiler = os.environ.get("CC", "cc")
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


class Window:
    """Opens the callgrind window at item WARMUP, closes it STEPS items later."""

    def __init__(self, library: str | None) -> None:
        self.lib = ctypes.CDLL(library) if library else None
        self.items = 0

    def tick(self) -> None:
        if self.lib is not None:
            if self.items == WARMUP:
                gc.collect()
                gc.disable()  # one collection more or less in the window would move a step by thousands
                self.lib.window_open()
            elif self.items == WARMUP + STEPS:
                self.lib.window_close()
                gc.enable()
        self.items += 1


def dataset(window: Window) -> Any:
    """One batch per item (the loaders do not batch): one ``__getitem__`` per step."""
    import torch

    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 32, generator=gen), torch.randint(0, 8, (16,), generator=gen)) for _ in range(8)]

    class Batches(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return WARMUP + STEPS + 10

        def __getitem__(self, i: int) -> Any:
            window.tick()
            return batches[i % len(batches)]

    return Batches()


def hw_callbacks(events: tuple[str, ...], k: int) -> list[Any]:
    import hookwrap as hw

    def noop(self: Any, trainer: Any) -> None:
        return None

    body = {event.replace("-", "_"): noop for event in events}
    return [type(f"NoOp{i}", (hw.Callback,), dict(body))() for i in range(k)]


def run_lightning(window: Window, variant: str, k: int, workdir: Path) -> None:
    import lightning.pytorch as pl
    import torch

    import hookwrap as hw

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 8)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            inputs, targets = batch
            return torch.nn.functional.cross_entropy(self.layer(inputs), targets)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    native, ours = HOOKS["lightning"]
    callbacks: list[Any] = []
    if variant == "native":
        def noop(self: Any, *args: Any, **kwargs: Any) -> None:
            return None
        callbacks = [type(f"NoOp{i}", (pl.Callback,), {h: noop for h in native})() for i in range(k)]
    torch.manual_seed(0)
    module = Module()
    if variant == "preset":
        from hookwrap.integrations import lightning as hw_pl
        hw_pl.weave(Module)
        for cb in hw_callbacks(ours, k):
            hw.add_callback(module, cb)
    trainer = pl.Trainer(max_steps=WARMUP + STEPS + 2, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, callbacks=callbacks, default_root_dir=str(workdir))
    loader = torch.utils.data.DataLoader(dataset(window), batch_size=None, shuffle=False)
    trainer.fit(module, loader)


def run_ignite(window: Window, variant: str, k: int, workdir: Path) -> None:
    import torch
    from ignite.engine import Engine, Events

    import hookwrap as hw

    torch.manual_seed(0)
    model = torch.nn.Linear(32, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def update(engine: Any, batch: Any) -> Any:
        optimizer.zero_grad()
        inputs, targets = batch
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    if variant == "preset":
        from hookwrap.integrations import ignite as hw_ignite
        hw_ignite.weave()
    engine = Engine(update)
    native, ours = HOOKS["ignite"]
    if variant == "native":
        for _ in range(k):
            for event in native:
                engine.add_event_handler(getattr(Events, event), lambda engine: None)
    if variant == "preset":
        for cb in hw_callbacks(ours, k):
            hw.add_callback(engine, cb)
    loader = torch.utils.data.DataLoader(dataset(window), batch_size=None, shuffle=False)
    engine.run(loader, max_epochs=1, epoch_length=WARMUP + STEPS + 2)


def run_transformers(window: Window, variant: str, k: int, workdir: Path) -> None:
    import torch
    import transformers

    import hookwrap as hw

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 8)

        def forward(self, inputs: Any, labels: Any) -> Any:
            return {"loss": torch.nn.functional.cross_entropy(self.layer(inputs), labels)}

    class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.batches = dataset(window)

        def __len__(self) -> int:
            return len(self.batches)

        def __getitem__(self, i: int) -> Any:
            inputs, targets = self.batches[i]
            return {"inputs": inputs, "labels": targets}

    native, ours = HOOKS["transformers"]
    callbacks: list[Any] = []
    if variant == "native":
        def noop(self: Any, *args: Any, **kwargs: Any) -> None:
            return None
        callbacks = [type(f"NoOp{i}", (transformers.TrainerCallback,), {h: noop for h in native})()
                     for i in range(k)]
    if variant == "preset":
        from hookwrap.integrations import transformers as hw_hf
        hw_hf.weave()
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(workdir), max_steps=WARMUP + STEPS + 2, per_device_train_batch_size=1,
        learning_rate=0.01, optim="sgd", lr_scheduler_type="constant", report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, use_cpu=True, dataloader_num_workers=0,
        remove_unused_columns=False)

    def collate(items: list[Any]) -> Any:  # one item is a whole batch
        return items[0]

    trainer = transformers.Trainer(model=Model(), args=args, train_dataset=Rows(), data_collator=collate,
                                   callbacks=callbacks)
    if variant == "preset":
        for cb in hw_callbacks(ours, k):
            hw.add_callback(trainer, cb)
    trainer.train()


def _key(variant: str, k: int, pure: bool) -> str:
    return "none" if variant == "none" else f"{variant}{'-pure' if pure else ''} {k}"


RUNS = {"lightning": run_lightning, "ignite": run_ignite, "transformers": run_transformers}


def count(framework: str, variant: str, k: int, pure: bool, library: Path, pad: int = 0) -> float:
    """Instructions per step of one run, in a process of its own under callgrind;
    ``pad``: the length of an environment variable, which moves the process's memory
    layout (and with it the framework's own count, by up to a few thousand a step)."""
    with tempfile.TemporaryDirectory(prefix="hookwrap-framework-costs-") as out:
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "HOOKWRAP_COSTS_PAD": "x" * pad}
        if pure:
            env["HOOKWRAP_NO_EXTENSIONS"] = "1"
        result = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.%p",
             sys.executable, __file__, "--run", framework, variant, str(k), str(library)],
            capture_output=True, text=True, env=env, check=False)
        dumps = [p for p in Path(out).iterdir() if p.name.endswith(".1")]
        if result.returncode != 0 or len(dumps) != 1:
            raise SystemExit(f"framework_costs: no window count for {framework} {variant} {k}:\n"
                             f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        for line in dumps[0].read_text().splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1]) / STEPS
    raise SystemExit(f"framework_costs: no totals in the callgrind dump of {framework} {variant} {k}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs=4, metavar=("FRAMEWORK", "VARIANT", "K", "LIBRARY"), help=argparse.SUPPRESS)
    parser.add_argument("--only", help="comma-separated frameworks: " + ", ".join(FRAMEWORKS))
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (2)")
    parser.add_argument("--again", help="count only these variants again (as 'preset-pure 1,native 8'), "
                                        "keeping the --json file's other counts")
    parser.add_argument("--repeats", type=int, default=3, choices=range(1, len(PADS) + 1),
                        help="memory layouts each variant is counted in; the median is kept (3)")
    args = parser.parse_args(argv)
    if args.run:
        import torch

        torch.set_num_threads(1)
        framework, variant, k, library = args.run
        with tempfile.TemporaryDirectory(prefix="hookwrap-framework-run-") as workdir:
            RUNS[framework](Window(library if library != "-" else None), variant, int(k), Path(workdir))
        return
    frameworks = args.only.split(",") if args.only else list(FRAMEWORKS)
    unknown = set(frameworks) - set(FRAMEWORKS)
    if unknown:
        parser.error(f"unknown frameworks {sorted(unknown)}; known: {', '.join(FRAMEWORKS)}")
    if shutil.which("valgrind") is None:
        raise SystemExit("framework_costs: valgrind is not installed")
    if args.again and not (args.json and Path(args.json).exists()):
        parser.error("--again needs --json naming the file of an earlier run")
    runs = [(f, "none", 0, False) for f in frameworks]
    runs += [(f, "native", k, False) for f in frameworks for k in NATIVE_K]
    runs += [(f, "preset", k, pure) for f in frameworks for pure in (False, True) for k in PRESET_K]
    if args.again:  # count these variants again, into the --json file's other counts
        runs = [r for r in runs if _key(*r[1:]) in args.again.split(",")]
    pads = PADS[:args.repeats]
    with tempfile.TemporaryDirectory(prefix="hookwrap-framework-costs-") as tmp:
        library = build_helper(Path(tmp))
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            counts = list(pool.map(lambda r: count(*r[0], library, r[1]), [(r, pad) for r in runs for pad in pads]))
    table: dict[str, dict[str, float]] = {}
    samples: dict[str, dict[str, list[float]]] = {}
    if args.again:
        kept = json.loads(Path(args.json).read_text())
        table, samples = kept["instructions"], kept["samples"]
    for i, (framework, variant, k, pure) in enumerate(runs):
        key = _key(variant, k, pure)
        got = counts[i * len(pads):(i + 1) * len(pads)]
        samples.setdefault(framework, {})[key] = got
        table.setdefault(framework, {})[key] = statistics.median(got)
    for framework, row in table.items():
        base = row["none"]
        spread = samples[framework]["none"]
        print(f"{framework}: {base:,.0f} instructions a step alone (median of {len(pads)} layouts; "
              f"{min(spread):,.0f} to {max(spread):,.0f})")
        for key, n in row.items():
            if key != "none":
                print(f"  {key:<14}{n:>14,.0f}{n - base:>+12,.0f}")
    if args.json:  # what tools/perf_tables.py makes the performance page's table of
        import hookwrap

        meta = {"python": sys.version.split()[0], "window": [WARMUP, STEPS], "hooks": HOOKS, "layouts": len(pads),
                "loop": "Linear(32, 8), SGD, batches of 16, on the CPU",
                "extension_built": hookwrap.USING_EXTENSION}
        Path(args.json).write_text(json.dumps({**meta, "instructions": table, "samples": samples}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
