"""``hookwrap run --config run.toml``: the options of a run in a file kept beside the
script (TOML, read with the standard library's ``tomllib``), each key an option of
the command line, written as it would be typed there:

    script = "train.py"            # and its arguments: args = ["--epochs", "2"]
    preset = ["torch_optim"]
    weave = ["evaluate=__main__:estimate_loss"]
    train_only = ["loss"]
    only = ["evaluate: data_source is val_data"]
    callback = ["EarlyStopping('return_value', patience=2)",
                {expr = "GradNorm(model='__main__:netD', event='step', name='grad_norm_D')",
                 when = "obj is optimizerD"}]
    stop_as = "KeyboardInterrupt"
    state = "run.state.pt"
    step = "iter_num"

Paths are read as on the command line: from the folder ``hookwrap run`` runs in.
Options given on the command line as well add to the file's lists and replace its
single values; a script named there replaces the file's, with its arguments."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .errors import closest

__all__ = ["RunFile", "RunFileError", "read_run_file"]

PROG = "hookwrap run"
_LISTS = ("preset", "weave", "train_only", "only", "args")
_SINGLE = ("script", "stop_as", "state", "step")


class RunFileError(Exception):
    """A run file that cannot be used: its message names the file, the key and the fix."""


@dataclass
class RunFile:
    """What a run file holds, checked: each list a list of strings, each callback an
    expression with its condition or None."""

    path: str
    lists: dict[str, list[str]] = field(default_factory=dict)
    single: dict[str, str] = field(default_factory=dict)
    callbacks: list[tuple[str, str | None]] = field(default_factory=list)


def read_run_file(path: str) -> RunFile:
    """The run file at ``path``, checked; a RunFileError names what is wrong."""
    import tomllib

    where = f"{PROG}: --config {path}"
    if not os.path.isfile(path):
        raise RunFileError(f"{where}: no such file. Give the path of a TOML file (run.toml).")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise RunFileError(f"{where}: not valid TOML ({exc}).") from None
    known = [*_LISTS, *_SINGLE, "callback"]
    run = RunFile(path)
    for key, value in data.items():
        if key in _LISTS:
            run.lists[key] = _strings(value, where, key)
        elif key in _SINGLE:
            if not isinstance(value, str) or not value:
                raise RunFileError(f"{where}: {key} must be a string, as typed after --{key.replace('_', '-')}, "
                                   f"got {value!r}.")
            run.single[key] = value
        elif key == "callback":
            run.callbacks = _callbacks(value, where)
        else:
            raise RunFileError(f"{where}: no option {key!r}.{closest(key, known)} Its keys: {', '.join(known)}.")
    if "args" in run.lists and "script" not in run.single:
        raise RunFileError(f"{where}: args are the script's arguments, and no script is named: add "
                           f"script = \"train.py\".")
    return run


def _strings(value: Any, where: str, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RunFileError(f"{where}: {key} must be a list of strings ({key} = [\"...\"]), got {value!r}.")
    return value


def _callbacks(value: Any, where: str) -> list[tuple[str, str | None]]:
    """``callback``: strings, or tables ``{expr = "...", when = "..."}``."""
    items = value if isinstance(value, list) else [value]
    out: list[tuple[str, str | None]] = []
    for item in items:
        if isinstance(item, str):
            out.append((item, None))
            continue
        if isinstance(item, dict) and isinstance(item.get("expr"), str) and set(item) <= {"expr", "when"} \
                and isinstance(item.get("when", ""), str):
            out.append((item["expr"], item.get("when")))
            continue
        raise RunFileError(f"{where}: each callback is a --callback expression (a string) or a table "
                           f"{{expr = \"...\", when = \"...\"}} (when: its --when), got {item!r}.")
    return out
