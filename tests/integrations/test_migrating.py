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
    "Lightning": ("lightning.pytorch.callbacks", "lightning.pytorch", "lightning.pytorch.plugins.environments"),
    "Hugging Face": ("transformers",),
    "ignite": ("ignite.handlers", "ignite.metrics"),
    "pytorch-accelerated": ("pytorch_accelerated.callbacks", "pytorch_accelerated"),
    "hookwrap": ("hookwrap.torch",),
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
