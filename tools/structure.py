"""The package's shape, in the figures issue 33 asks for: modules and lines per
layer, floors of imports (the longest chain of import-time imports inside the
core), and the modules a registration and a cache-miss call pass through.

    python tools/structure.py            # a table
    python tools/structure.py --json F   # the same, as JSON

"Core" is every module of ``hookwrap`` itself outside its subpackages (the
compiled ``_fast.pyx`` counted as a module); the layers are ``torch``,
``integrations`` and ``_bench``. Floors count modules: a core that imports
nothing of hookwrap is one floor. Calls are traced with ``sys.setprofile`` in
the installed twin (``HOOKWRAP_NO_EXTENSIONS=1`` for the pure one); a module
counts once however often it is entered.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "core"))
from test_import_graph import SRC, core_graph, longest_chains  # noqa: E402  (the layering test's own reading)


def modules_and_lines() -> dict[str, dict[str, int]]:
    layers: dict[str, dict[str, int]] = {}
    for path in sorted(SRC.rglob("*.py")) + sorted(SRC.glob("*.pyx")):
        rel = path.relative_to(SRC)
        layer = rel.parts[0] if len(rel.parts) > 1 else "core"
        row = layers.setdefault(layer, {"modules": 0, "lines": 0})
        row["modules"] += 1
        row["lines"] += len(path.read_text(encoding="utf-8").splitlines())
    return layers


def floors() -> tuple[int, list[str]]:
    """The longest chain of import-time imports among the core's modules."""
    longest = max(longest_chains(core_graph()).values(), key=len)
    return len(longest), longest


def modules_entered(action: Callable[[], Any]) -> list[str]:
    """The hookwrap modules whose Python functions run during ``action()``."""
    seen: dict[str, None] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("hookwrap") and name not in seen:
                seen[name] = None

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return list(seen)


def traced_paths() -> dict[str, list[str]]:
    import hookwrap

    class Trainer(hookwrap.Hookable):
        @hookwrap.hookable
        def loss(self, x: float) -> float:
            return x

    def callback(self: Any, x: float) -> float:
        return x

    trainer = Trainer()
    trainer.loss(1.0)  # the class is prepared, its join point built: only the registration is traced
    registration = modules_entered(lambda: trainer.before("loss", callback))
    cache_miss = modules_entered(lambda: trainer.loss(1.0))
    return {"registration": registration, "cache miss": cache_miss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the figures to this file as JSON")
    args = parser.parse_args()
    import hookwrap

    figures: dict[str, Any] = {"twin": "compiled" if hookwrap.USING_EXTENSION else "pure",
                               "layers": modules_and_lines()}
    figures["floors"], figures["longest chain"] = floors()
    figures["paths"] = traced_paths()
    for layer, row in figures["layers"].items():
        print(f"{layer:14} {row['modules']:3} modules {row['lines']:6} lines")
    print(f"core floors: {figures['floors']} ({' -> '.join(m[9:] for m in figures['longest chain'])})")
    for what, modules in figures["paths"].items():
        print(f"{what} ({figures['twin']}): {len(modules)} modules: {', '.join(m[9:] for m in modules)}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
