"""docs/guide/migrating.md: the table of each library's shipped callbacks beside
hookwrap's names only what exists, in the versions the tests pin. A callback or
handler is looked up where the library exports them; ``Trainer(name=...)`` is an
argument of its trainer (pytorch-accelerated: ``Trainer.train(name=...)``);
``name=`` (Hugging Face) a field of ``TrainingArguments``."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.third_party

ROOT = Path(__file__).resolve().parents[2]
HEADER = "| job | Lightning | Hugging Face | ignite | pytorch-accelerated | hookwrap |"
# Where each library exports its callbacks (or handlers), and its trainer.
EXPORTS = {
    "Lightning": ("lightning.pytorch.callbacks", "lightning.pytorch", "lightning.pytorch.plugins",
                  "lightning.pytorch.plugins.environments", "lightning.pytorch.utilities"),
    "Hugging Face": ("transformers",),
    "ignite": ("ignite.handlers", "ignite.metrics", "ignite.engine", "ignite.handlers.tensorboard_logger"),
    "pytorch-accelerated": ("pytorch_accelerated.callbacks", "pytorch_accelerated"),
    "hookwrap": ("hookwrap.torch",),
}


# What a library would export, or take as an option, to do each job: a "-" cell is
# checked against them, so a name the table misses (a library's new callback) fails.
PROBES: dict[str, str] = {
 "stop when a metric stops improving": r"(?i)early.?stop",
 "save checkpoints to resume from": r"(?i)checkpoint|save_?training|save_strategy",
 "keep the best weights": r"(?i)best",
 "stop on a NaN or inf loss": r"(?i)terminate.?on.?nan|anomaly",
 "log metrics to files and trackers": r"(?i)logger$|report_to|log_?metrics",
 "progress bar": r"(?i)progress",
 "step an LR scheduler per update, with warm-up": r"(?i)lr.?sched|scheduler",
 "learning rate": r"(?i)(lr|learning.?rate).?(monitor|logger|log)",
 "gradient norm": r"(?i)grad.?norm.*(monitor|log)|gradnorm",
 "per-layer gradient and weight norms": r"(?i)grads?.?(scalar|hist)|weights?.?(scalar|hist)|^grad_norm$",
 "gradient and weight histograms": r"(?i)hist(?!ory)",
 "clip gradients": r"(?i)clip",
 "accumulate gradients": r"(?i)accumulat",
 "average the weights": r"EMA|(?i:(^|_)ema|weight.?averag|swa\b)",
 "mixed precision": r"(?i)precision|amp|bf16|autocast",
 "float16 loss scaling": r"(?i)scaler|fp16",
 "stop on a loss spike": r"(?i)spike",
 "skip the update of a bad batch and go on": r"(?i)skip.?(bad|step|batch)",
 "roll back to the last good weights and go on past the bad batches": r"(?i)roll.?back|revert|restore.?(last|good)",
 "evaluate before the first step": r"(?i)eval\w*.?on.?start|evaluate.?first|val\w*.?before",
 "stop when good enough, or hopeless": r"(?i)stopping.?threshold|divergence.?threshold",
 "stop at a time limit": r"(?i)time.?limit|max.?time|duration",
 "write checkpoints in the background": r"(?i)async",
 "save every N minutes": r"(?i)time.?interval|every.?n.?min|save.?time",
 "save when the run raises": r"(?i)exception.?checkpoint|on.?exception",
 "save on preemption (`SIGTERM`, SLURM's `SIGUSR1`)": r"(?i)requeue|preempt|sigterm",
 "time each step": r"(?i)^timer$|step.?tim",
 "throughput": r"(?i)throughput|tokens.?seen",
 "device memory": r"(?i)memory|gpu.?info|device.?stats",
 "profile": r"(?i)profil",
}
# Names the probes find that do another job.
NOT_THE_JOB = {
    ("stop at a time limit", "Hugging Face", "MaxTimeCriteria"),  # generate()'s stopping criterion
    ("time each step", "Lightning", "Timer"),  # times a stage in total (the time-limit row's)
    ("time each step", "Lightning", "timer"),  # its module
}


def table() -> list[dict[str, str]]:
    page = (ROOT / "docs" / "guide" / "migrating.md").read_text(encoding="utf-8")
    assert HEADER in page
    lines = page[page.index(HEADER):].split("\n\n")[0].splitlines()
    columns = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(columns, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


def names(cell: str) -> list[str]:
    """The code spans of a cell: what it names (text outside them says how)."""
    return re.findall(r"`([^`]+)`", cell)


def lookup(library: str, name: str) -> Any:
    for module in EXPORTS[library]:
        found = getattr(importlib.import_module(module), name, None)
        if found is not None:
            return found
    raise AssertionError(f"{library} exports no {name!r} (looked in {', '.join(EXPORTS[library])})")


def check(library: str, name: str) -> None:
    option = re.fullmatch(r"(\w+(?:\.\w+)?)\((\w+)=[^)]*\)", name)
    if option:  # Trainer(name=...), Trainer.train(name=...), Checkpoint(on_exception=True)
        owner, _, method = option.group(1).partition(".")
        target = lookup(library, owner)
        signature = inspect.signature(getattr(target, method) if method else target)
        assert option.group(2) in signature.parameters, f"{library}: {option.group(1)} takes no {option.group(2)}="
    elif name.endswith("="):  # a field of Hugging Face's TrainingArguments
        assert library == "Hugging Face", name
        fields = {field.name for field in dataclasses.fields(lookup(library, "TrainingArguments"))}
        assert name[:-1] in fields, f"TrainingArguments has no {name}"
    else:
        lookup(library, name)


def test_every_row_names_a_hookwrap_callback() -> None:
    pytest.importorskip("torch", reason="needs the torch extra")
    import hookwrap

    rows = table()
    assert len(rows) >= 15
    for row in rows:
        assert names(row["hookwrap"]), row["job"]
        for name in names(row["hookwrap"]):
            check("hookwrap", name)
            assert issubclass(lookup("hookwrap", re.split(r"\W", name)[0]), hookwrap.Callback), name


@pytest.mark.parametrize("library", [column for column in EXPORTS if column != "hookwrap"])
def test_every_other_library_exports_what_the_table_names(library: str) -> None:
    pytest.importorskip(EXPORTS[library][0].split(".")[0], reason="needs the thirdparty extra")
    checked = 0
    for row in table():
        cell = row[library]
        if cell == "-":
            continue
        # A parenthesised remark names what is logged, not what is exported.
        for name in names(re.sub(r"\(logs `\w+`\)", "", cell)):
            check(library, name)
            checked += 1
    assert checked >= 8, f"{library}: only {checked} names checked"


def exported(library: str) -> set[str]:
    """What the library exports where the table looks, and the options of its trainer."""
    found = {n for module in EXPORTS[library] for n in dir(importlib.import_module(module)) if not n.startswith("_")}
    if library == "Hugging Face":  # its callbacks, among every model's classes, and the Trainer's options
        found = {n for n in found if n.endswith("Callback")}
        found |= {field.name for field in dataclasses.fields(lookup(library, "TrainingArguments"))}
    trainer = {"Lightning": lambda: lookup(library, "Trainer"),
               "pytorch-accelerated": lambda: lookup(library, "Trainer").train,
               "ignite": lambda: lookup(library, "create_supervised_trainer")}.get(library)
    if trainer is not None:
        found |= set(inspect.signature(trainer()).parameters)
    return found


@pytest.mark.parametrize("library", [column for column in EXPORTS if column != "hookwrap"])
def test_a_dash_is_a_job_the_library_has_nothing_for(library: str) -> None:
    """A "-" cell: nothing the library exports, nor an option of its trainer, has a
    name of that job (PROBES); each row has its probe."""
    pytest.importorskip(EXPORTS[library][0].split(".")[0], reason="needs the thirdparty extra")
    names_there = exported(library)
    for row in table():
        assert row["job"] in PROBES, f"no probe for the row {row['job']!r}"
        if row[library] != "-":
            continue
        found = sorted(n for n in names_there if re.search(PROBES[row["job"]], n)
                       and (row["job"], library, n) not in NOT_THE_JOB)
        assert found == [], f"{library} has {found} for {row['job']!r}, where the table says '-'"
