"""The documentation's examples run and print what the page says: every ```python
block of README.md and docs/**/*.md followed by a ```text block; the demo trains."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The pages whose ```python blocks are examples. docs/design/contract.md is the
# design contract: its blocks are sketches of the API (`def step(self, batch): ...`).
CONTRACT = "docs/design/contract.md"
PAGES = ["README.md"] + sorted(
    path.relative_to(ROOT).as_posix() for path in Path(ROOT, "docs").rglob("*.md")
    if path.relative_to(ROOT).as_posix() != CONTRACT
)
# Tested before the README became a landing page and its content moved into docs/:
# no example may stop being tested.
EXAMPLES_BEFORE_THE_SITE = 21


def read(page: str) -> str:
    return Path(ROOT, page).read_text(encoding="utf-8")


def examples() -> list[tuple[str, str, str]]:
    """(page:index, code, the output shown) for each example of each page."""
    found = []
    for page in PAGES:
        pairs = re.findall(r"```python\n(.*?)```\n\n```text\n(.*?)```", read(page), flags=re.S)
        found += [(f"{page}:{i}", code, shown) for i, (code, shown) in enumerate(pairs)]
    return found


EXAMPLES = examples()
# Examples that import a third-party trainer (the thirdparty extra) are third_party
# tests: CI runs them with that extra installed (pytest -m third_party).
FRAMEWORKS = ("transformers", "lightning", "ignite", "accelerate", "pytorch_accelerated")
# Likewise the loggers of the loggers extra (MetricsLogger's examples).
LOGGERS = ("mlflow", "wandb")


def _frameworks(code: str, names: tuple[str, ...] = FRAMEWORKS) -> list[str]:
    return [name for name in names if re.search(rf"^(from|import) {name}\b", code, flags=re.M)]


def test_the_docs_have_their_examples():
    assert len(EXAMPLES) >= EXAMPLES_BEFORE_THE_SITE
    assert any(name.startswith("README.md:") for name, _, _ in EXAMPLES)
    assert {name for _, code, _ in EXAMPLES for name in _frameworks(code)} == set(FRAMEWORKS)


def test_every_python_block_shows_its_output():
    # A ```python block without the ```text block after it would run in no test.
    for page in PAGES:
        text = read(page)
        blocks = len(re.findall(r"^```python\n", text, flags=re.M))
        paired = len(re.findall(r"```python\n.*?```\n\n```text\n", text, flags=re.S))
        assert blocks == paired, f"{page}: {blocks - paired} python block(s) without a text block after"


def test_the_readme_is_a_landing_page_whose_links_resolve():
    readme = read("README.md")
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if "://" not in link and not Path(ROOT, link).exists()]
    assert not missing, missing


def test_every_page_is_in_the_site_navigation():
    nav = read("mkdocs.yml")
    pages = [path.relative_to(Path(ROOT, "docs")).as_posix() for path in Path(ROOT, "docs").rglob("*.md")]
    assert len(pages) >= 15
    assert [page for page in pages if f": {page}\n" not in nav] == []


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[pytest.mark.third_party] if _frameworks(code) or _frameworks(code, LOGGERS) else [],
                 id=name)
    for name, code, _ in EXAMPLES
])
def test_example_prints_what_the_page_shows(hw, name):
    code, expected = next((code, shown) for n, code, shown in EXAMPLES if n == name)
    if "torch" in code:  # hookwrap.torch's examples need the torch extra
        pytest.importorskip("torch", reason="the torch extra is not installed")
    for framework in _frameworks(code):
        pytest.importorskip(framework, reason="needs the thirdparty extra")
    for logger in _frameworks(code, LOGGERS):
        pytest.importorskip(logger, reason="needs the loggers extra")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module = "docs_" + re.sub(r"\W", "_", name)
        exec(compile(code, "example.py", "exec"), {"__name__": module})
    assert out.getvalue() == expected


def test_demo_command_refuses_an_unknown_command():
    bad = subprocess.run([sys.executable, "-m", "hookwrap", "nope"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'nope'" in bad.stderr


def test_every_shipped_callback_is_listed_with_its_keywords_events_reads_and_changes():
    """docs/guide/shipped-callbacks.md: each Callback hookwrap.torch exports has a row
    in the table of what it does and in the one of its events, reads and changes."""
    pytest.importorskip("torch", reason="needs the torch extra")
    import hookwrap
    import hookwrap.torch as torch_callbacks

    shipped = {name for name in torch_callbacks.__all__
               if isinstance(getattr(torch_callbacks, name), type)
               and issubclass(getattr(torch_callbacks, name), hookwrap.Callback)}
    assert {"GradClip", "Profiler", "Throughput", "MetricsLogger"} <= shipped
    page = Path(ROOT, "docs", "guide", "shipped-callbacks.md").read_text(encoding="utf-8")
    header = "| callback | events (default) | reads | changes | other keywords |"
    assert header in page
    table = page[page.index(header):].split("\n\n")[0].splitlines()[2:]
    rows = {row.split("`")[1]: row.split(" | ") for row in table}
    assert set(rows) == shipped
    for name, cells in rows.items():
        assert len(cells) == 5 and all(cell.strip(" |") for cell in cells), name
    does = page[:page.index(header)]
    missing = [name for name in shipped if f"`{name}(" not in does and f"`{name}`" not in does]
    assert missing == []


def test_the_supported_versions_page_says_what_ci_installs():
    """docs/guide/supported-versions.md: its Pythons are pyproject's classifiers, its
    torch the README's pin, and its frameworks' versions tests/pins.txt, each row
    naming an extra pyproject defines."""
    import tomllib

    page = Path(ROOT, "docs", "guide", "supported-versions.md").read_text(encoding="utf-8")
    project = tomllib.loads(Path(ROOT, "pyproject.toml").read_text(encoding="utf-8"))["project"]
    claimed = sorted(c.rsplit(" ", 1)[1] for c in project["classifiers"]
                     if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    rows = [line.split(" | ") for line in page.splitlines() if line.startswith("| Python | ")]
    assert sorted(v for row in rows for v in row[1].split(", ")) == claimed
    torch_pin = re.search(r"torch==([\d.]+)", Path(ROOT, "README.md").read_text(encoding="utf-8")).group(1)
    assert f"| torch | {torch_pin} (CPU) |" in page
    pins = dict(line.split("==") for line in Path(ROOT, "tests", "pins.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    table = page[page.index("| framework | pinned for the tests | extra |"):].split("\n\n")[0].splitlines()[2:]
    listed = {row.split(" | ")[0].strip("| "): row.split(" | ")[1] for row in table}
    assert listed == pins
    extras = set(project["optional-dependencies"])
    for row in table:
        for extra in re.findall(r"`hookwrap\[([\w-]+)\]`", row):
            assert extra in extras, f"{row}: pyproject has no extra {extra!r}"
