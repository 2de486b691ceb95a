"""The package's layering: no module imports, at import time, one that imports it
back (an import cycle makes the order modules load in matter, and hides which
layer a concept belongs to). Imports inside functions and under TYPE_CHECKING
are left out: they run later, or never."""

from __future__ import annotations

import ast
import os
from pathlib import Path

SRC = Path(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) / "src" / "hookwrap"


def module_name(path: Path) -> str:
    parts = ("hookwrap",) + path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_time_imports(source: str, module: str, is_package: bool) -> set[str]:
    """The hookwrap modules ``module`` imports while it is imported."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                visit(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base.split(".")[0] == "hookwrap":
                    # `from . import _fast_py` imports a module; `from ._x import y`, _x.
                    found.add(base)
                    found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "hookwrap")
            if isinstance(node, ast.ClassDef):
                visit(node.body)
            for field in ("body", "orelse", "handlers", "finalbody"):
                if not isinstance(node, ast.ClassDef):
                    visit(getattr(node, field, None) or [])

    visit(ast.parse(source).body)
    return found


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(SRC.rglob("*.py")):
        module = module_name(path)
        graph[module] = import_time_imports(path.read_text(encoding="utf-8"), module,
                                            path.name == "__init__.py")
    for module, deps in graph.items():
        # Only modules (not names imported from them), and not the packages holding
        # `module`: Python imports those before it anyway (`from . import _fast_py`).
        graph[module] = {d for d in deps if d in graph and not (module + ".").startswith(d + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each back edge found by a depth-first walk."""
    found: list[list[str]] = []
    state: dict[str, int] = {}
    path: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                found.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                walk(dep)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    return found


def test_the_check_finds_a_cycle_and_reads_relative_imports():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = ("from . import _fast_py as pure\n"
              "from ._owners import lock\n"
              "from .. import errors\n"
              "def later():\n"
              "    from ._late import x\n"
              "if TYPE_CHECKING:\n"
              "    from ._typing import T\n")
    found = import_time_imports(source, "hookwrap.torch.x", is_package=False)
    assert {"hookwrap.torch._fast_py", "hookwrap.torch._owners", "hookwrap.errors"} <= found
    assert not any("_late" in f or "_typing" in f for f in found)


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "hookwrap._registry" in graph and "hookwrap._owners" in graph["hookwrap._registry"]
    assert cycles(graph) == []


def test_registration_layers_import_downward_only():
    """A registration's path (_registry -> _joinpoints -> _owners -> _entries):
    each of these imports only the ones below it, so it can call down and never back."""
    graph = import_graph()
    layers = ["hookwrap._registry", "hookwrap._joinpoints", "hookwrap._owners", "hookwrap._entries"]
    for i, module in enumerate(layers):
        above = set(layers[:i])
        assert not graph[module] & above, f"{module} imports {sorted(graph[module] & above)}, above it"


def test_the_compiled_twin_imports_nothing_of_the_pure_one():
    """``_fast.pyx`` mirrors ``_rules`` and takes its constants from there; it
    never reaches into the pure twin (``_fast_py``, with its code generator)."""
    source = (SRC / "_fast.pyx").read_text(encoding="utf-8")
    imported = {line.split()[1] for line in source.splitlines() if line.startswith(("from .", "import "))}
    assert "._rules" in imported
    assert "._fast_py" not in imported, sorted(imported)


def core_graph() -> dict[str, set[str]]:
    """The core's modules (``hookwrap/*.py`` but ``__init__``, and the compiled
    ``_fast.pyx``, read for its imports too) -> the core modules each imports at
    import time."""
    core = {f"hookwrap.{path.stem}" for path in SRC.glob("*.py") if path.stem != "__init__"} | {"hookwrap._fast"}
    graph = import_graph()
    pyx = (SRC / "_fast.pyx").read_text(encoding="utf-8")
    graph["hookwrap._fast"] = {f"hookwrap.{line.split()[1][1:]}" for line in pyx.splitlines()
                               if line.startswith("from .")}
    return {module: graph[module] & core for module in core}


def longest_chains(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's longest chain of imports down through ``graph``, itself first:
    its floor is the chain's length."""
    chains: dict[str, list[str]] = {}

    def chain(module: str) -> list[str]:
        if module not in chains:
            chains[module] = [module] + max((chain(d) for d in graph[module]), key=len, default=[])
        return chains[module]

    for module in graph:
        chain(module)
    return chains


def test_the_layout_page_names_every_core_module_on_its_floor():
    """docs/design/layout.md shows the core floor by floor: every module of it is
    named, on the floor its imports put it (one more than the highest floor it
    imports from; ``_fast.pyx`` read for its imports too)."""
    import re

    text = (SRC.parent.parent / "docs" / "design" / "layout.md").read_text(encoding="utf-8")
    named: dict[str, str] = {}
    for floor, files in re.findall(r"^\| (\d+|top) \| ((?:`[^`]+`(?:, )?)+) \|", text, re.M):
        for name in re.findall(r"`(?:hookwrap/)?([\w.]+)`", files):
            named[name] = floor
    core = {path.name for path in SRC.glob("*.py")} | {"_fast.pyx"}
    assert set(named) == core, f"not on the page: {sorted(core - set(named))}; gone: {sorted(set(named) - core)}"
    chains = longest_chains(core_graph())
    for name, shown in named.items():
        if shown != "top":
            floor = len(chains["hookwrap." + name.rsplit(".", 1)[0]])
            assert shown == str(floor), f"{name} is on floor {floor}, the page says {shown}"
