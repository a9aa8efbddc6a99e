"""The package's layering: every import points down, and no imports form a cycle.

Each module of `fusegraph` is read with `ast` (nothing is imported), module-level and
function-level imports alike, relative imports resolved. The layers, lowest first:

    errors < ir < ops < zoo < {onnx, passes} < {targets.ref, targets.gpu} < api < dynamic_batch
    < saved_program < fusegraph < driver

A module may import its own layer and any layer below. Layers of one rank (in braces) are peers
and import neither each other: the ONNX frontend and the passes share folding and dead-code
removal through the ops and the ir, and each target stands on its own. `saved_program` writes and
reads .fgx files and compiles what it reads through the api; `dynamic_batch` (one program per
batch size, compiled through the api) sits between them, since a file can hold one. `zoo` is the model store
that `onnx/loader.py` and the driver read, below the frontend; the package itself (`fusegraph`,
which re-exports the api) sits just below the driver.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "fusegraph"

#: layer names by rank, lowest first; names of one rank are peers
LAYERS: list[tuple[str, ...]] = [
    ("errors",), ("ir",), ("ops",), ("zoo",), ("onnx", "passes"), ("targets", "targets.ref", "targets.gpu"),
    ("api",), ("dynamic_batch",), ("saved_program",), ("fusegraph",), ("driver",),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


class Import(NamedTuple):
    module: str  # the importing module
    line: int
    target: str  # the imported fusegraph module
    type_only: bool  # under `if TYPE_CHECKING:`: never runs, but still a dependency


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def layer_of(module: str) -> str:
    """The longest layer name that prefixes `module` below the package (the package itself is `fusegraph`)."""
    if module == "fusegraph":
        return "fusegraph"
    rest = module.removeprefix("fusegraph.")
    names = [n for n in RANK if rest == n or rest.startswith(n + ".")]
    assert names, f"{module} is in no layer: add its folder to LAYERS"
    return max(names, key=len)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name `from ... import` starts from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, source: str, is_package: bool, modules: dict[str, Path]) -> list[Import]:
    """The fusegraph modules `module` (whose code is `source`) imports, at any depth of its code."""
    found: list[Import] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(module, node.lineno, a.name, type_only) for a in node.names
                         if a.name.split(".")[0] == "fusegraph")
        elif isinstance(node, ast.ImportFrom):
            start = _resolve(module, is_package, node)
            if start.split(".")[0] == "fusegraph":
                for a in node.names:  # `from pkg import mod` imports the module pkg.mod
                    target = f"{start}.{a.name}" if f"{start}.{a.name}" in modules else start
                    found.append(Import(module, node.lineno, target, type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(ast.parse(source, module), False)
    return list(dict.fromkeys(found))  # `from m import a, b` is one import of m


def all_imports() -> list[Import]:
    modules = module_files()
    return [imp for name, path in modules.items()
            for imp in imports_of(name, path.read_text(), path.name == "__init__.py", modules)]


def upward(imp: Import) -> bool:
    """Whether `imp` points up or sideways to a peer layer."""
    here, there = layer_of(imp.module), layer_of(imp.target)
    return here != there and RANK[there] >= RANK[here]


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path back to its start) per back edge a depth-first search meets."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return cycles


def test_every_module_is_read() -> None:
    imports = all_imports()
    assert {"fusegraph", "fusegraph.api", "fusegraph.ir.program", "fusegraph.zoo._params"} <= set(module_files())
    zoo_lines = (PACKAGE_DIR / "zoo" / "__init__.py").read_text().splitlines()
    line = next(k for k, text in enumerate(zoo_lines, 1) if text.startswith("from ..errors import"))
    assert Import("fusegraph.zoo", line, "fusegraph.errors", False) in imports  # a relative import, resolved
    assert any(i.module == "fusegraph.ops.base" and i.type_only for i in imports)


def test_imports_point_down() -> None:
    bad = [f"{i.module}:{i.line} imports {i.target} ({layer_of(i.module)} may not import {layer_of(i.target)}"
           f"{', a type-only import' if i.type_only else ''})" for i in all_imports() if upward(i)]
    assert not bad, "upward or sideways imports:\n  " + "\n  ".join(bad)


def test_no_import_cycles() -> None:
    """Imports under `if TYPE_CHECKING:` never run, so they close no cycle; function-level ones do
    (a cycle hidden in a function is still a cycle)."""
    edges: dict[str, set[str]] = {}
    for i in all_imports():
        if not i.type_only and i.target != i.module:
            edges.setdefault(i.module, set()).add(i.target)
    cycles = find_cycles(edges)
    assert not cycles, "import cycles:\n  " + "\n  ".join(" -> ".join(c) for c in cycles)


def test_the_checks_catch_what_they_forbid() -> None:
    """On code made up here: an upward import inside a function, a peer import, a relative one, a cycle."""
    modules = module_files()
    source = "def run():\n    from fusegraph.targets.ref import runner\n"
    (imp,) = imports_of("fusegraph.ir.program", source, False, modules)
    assert imp == Import("fusegraph.ir.program", 2, "fusegraph.targets.ref.runner", False) and upward(imp)
    (imp,) = imports_of("fusegraph.onnx.context", "from ..passes import dead_code\n", False, modules)
    assert imp.target == "fusegraph.passes.dead_code" and upward(imp)
    (imp,) = imports_of("fusegraph.passes.pipeline", "from fusegraph.ops.base import is_fused\n", False, modules)
    assert not upward(imp)
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
