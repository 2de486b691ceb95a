"""What ``hookwrap run`` reads in the script's source before it runs: the names its
top level binds, where each is bound last (the script is compiled with a weave right
there), and stand-ins for the functions it defines, made from their ``def`` lines
alone, against which the callbacks are checked before the script's first line."""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from types import ModuleType
from typing import Any

def top_level_names(tree: ast.Module) -> set[str]:
    return {name for stmt in tree.body for name in _bound_names(stmt)}


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists of a compound statement that run in the module's own scope:
    what they bind is a global of the script (``if``/``else``, ``try``/``except``/
    ``else``/``finally``, ``with``, ``for``/``while`` and their ``else``, ``match`` cases)."""
    if isinstance(stmt, (ast.If, ast.For, ast.AsyncFor, ast.While)):
        return [stmt.body, stmt.orelse]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [stmt.body]
    if isinstance(stmt, (ast.Try, ast.TryStar)):
        return [stmt.body, *(handler.body for handler in stmt.handlers), stmt.orelse, stmt.finalbody]
    if isinstance(stmt, ast.Match):
        return [case.body for case in stmt.cases]
    return []


def _bound_names(stmt: ast.stmt) -> list[str]:
    """The names ``stmt`` binds in its scope: its own, and those of the statements in
    its blocks (a ``def`` inside a top-level ``if`` or ``try`` is a global too)."""
    names = _own_bound_names(stmt)
    for block in _blocks(stmt):
        for inner in block:
            names += _bound_names(inner)
    return names


def _own_bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"]
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        targets = [stmt.target]
    names = []
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.append(node.id)
    return names


@dataclass
class Site:
    """Where the script calls ``defined(name)``: after ``block[index]``. ``final``: the
    last place of the script where ``name`` can be bound."""

    block: list[ast.stmt]
    index: int
    final: bool = False


def last_bindings(tree: ast.Module, wanted: set[str]) -> dict[str, list[Site]]:
    """name -> where to weave it: after the top-level statement that binds it last and,
    when that statement is compound, after the last binding of each of its blocks too
    (the branch that runs binds it; a loop body binds it anew each time round)."""
    found: dict[str, list[Site]] = {}
    for name in wanted:
        sites = _sites(tree.body, name)
        if sites:
            sites[0].final = True
            found[name] = sites
    return found


def _sites(block: list[ast.stmt], name: str) -> list[Site]:
    for index in range(len(block) - 1, -1, -1):
        stmt = block[index]
        if name in _bound_names(stmt):
            # After the statement itself: whichever of its blocks ran (if any), the name
            # is bound as the rest of the script will see it.
            sites = [Site(block, index)]
            if name not in _own_bound_names(stmt):
                for inner in _blocks(stmt):
                    sites += _sites(inner, name)
            return sites
    return []


def inject(tree: ast.Module, positions: dict[str, list[Site]]) -> None:
    """At each site of ``positions``: ``<runner>.defined(name, final)``, on the last
    line of the statement it follows (other lines keep their numbers)."""
    by_place: dict[tuple[int, int], tuple[list[ast.stmt], list[tuple[str, bool]]]] = {}
    for name, sites in positions.items():
        for site in sites:
            by_place.setdefault((id(site.block), site.index), (site.block, []))[1].append((name, site.final))
    # From the end of each block back, so that the indices still to use stay valid.
    for (_, index), (block, names) in sorted(by_place.items(), key=lambda item: item[0][1], reverse=True):
        stmt = block[index]
        line = stmt.end_lineno or stmt.lineno
        for name, final in sorted(names, reverse=True):
            call = ast.parse(
                f"__import__('hookwrap._script_runner', None, None, ['_defined'])._defined({name!r}, {final})"
            ).body[0]
            for node in ast.walk(call):
                if hasattr(node, "lineno"):
                    node.lineno = node.end_lineno = line  # type: ignore[attr-defined]
                    node.col_offset = node.end_col_offset = 0  # type: ignore[attr-defined]
            block.insert(index + 1, call)


# Decorators that keep the signature of the function they wrap (functools.wraps):
# a stand-in made without them takes the same arguments. Any other decorator may
# change what the function takes, so its callbacks are checked once it is defined.
_KEEPS_SIGNATURE = frozenset({"no_grad", "inference_mode", "enable_grad", "set_grad_enabled", "autocast"})
_BINDS = frozenset({"staticmethod", "classmethod"})  # kept: they change how the method is called


def stand_in(tree: ast.Module, path: list[str], attr: str) -> tuple[Any, str] | None:
    """``(container, attr)``: a module or class holding a function made from the
    script's ``def`` of ``path``/``attr`` (its parameters, defaults None, its kind:
    plain, generator, coroutine), to weave in the place of the script's own before
    it runs. None where the source does not settle it: a name bound more than once or
    by something other than a ``def``/``class``, a method the class inherits, a
    decorator that may change the signature."""
    names = [*path, attr]
    node = _only_definition(tree.body, names[0])
    chain = [node]
    for name in names[1:]:
        if not isinstance(node, ast.ClassDef):
            return None
        node = _only_definition(node.body, name, nested=False)
        chain.append(node)
    stub = _stub(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if stub is None or not all(isinstance(outer, ast.ClassDef) for outer in chain[:-1]):
        return None
    for outer in reversed(chain[:-1]):  # the classes around it, bare
        bare = copy.copy(outer)  # its fields as the running Python's ast has them (type_params)
        bare.bases, bare.keywords, bare.body, bare.decorator_list = [], [], [stub], []
        stub = bare
    module = ModuleType("hookwrap-stand-in")
    exec(compile(ast.fix_missing_locations(ast.Module(body=[stub], type_ignores=[])),  # noqa: S102 - a bare def
                 "<hookwrap stand-in>", "exec"), vars(module))
    container: Any = module
    for name in path:
        container = getattr(container, name)
    return container, attr


def _only_definition(block: list[ast.stmt], name: str, nested: bool = True) -> Any:
    """The one statement of ``block`` (and, ``nested``, of its compound statements'
    blocks) that binds ``name``; None where there are none or several."""
    found: list[ast.stmt] = []

    def visit(statements: list[ast.stmt]) -> None:
        for stmt in statements:
            if name in _own_bound_names(stmt):
                found.append(stmt)
            if nested:
                for inner in _blocks(stmt):
                    visit(inner)

    visit(block)
    return found[0] if len(found) == 1 else None


def _decorator_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.stmt | None:
    kept: list[ast.expr] = []
    for decorator in node.decorator_list:
        name = _decorator_name(decorator)
        if name in _BINDS:
            kept.append(ast.Name(id=name, ctx=ast.Load()))
        elif name not in _KEEPS_SIGNATURE:
            return None
    stub = copy.deepcopy(node)
    stub.decorator_list, stub.returns = kept, None
    arguments = stub.args
    for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]:
        if arg is not None:
            arg.annotation = None
    arguments.defaults = [ast.Constant(None) for _ in arguments.defaults]
    arguments.kw_defaults = [None if d is None else ast.Constant(None) for d in arguments.kw_defaults]
    stub.body = [ast.Expr(ast.Yield(None)) if _yields(node) else ast.Pass()]
    return stub


def _yields(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Is the function a generator: a ``yield`` in its own body (not a nested scope's)?"""
    todo: list[ast.AST] = list(node.body)
    while todo:
        current = todo.pop()
        if isinstance(current, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(current))
    return False
