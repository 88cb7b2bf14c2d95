"""The house reads top-down: cli -> recipes -> tasks/data -> heads -> modeling -> padding/tokenization ->
config, with no import pointing up and no cycle (imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "bertkit"

# Lower numbers are higher in the house; a module may import its own layer or any layer below.
LAYERS = [
    ("cli", "__main__", "demo"),
    ("training", "features", "inference"),
    ("tasks", "data"),
    ("heads",),
    ("modeling",),
    ("padding", "tokenization", "checkpoint_io"),
    ("config", "outputs", "errors", "_parallel", "examples", "hub"),
]


def _layer(module: str) -> int:
    top = module.split(".")[1] if module.count(".") >= 1 else "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def _modules() -> dict[str, set[str]]:
    edges = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bertkit"):
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("bertkit")}
        edges[name] = {d for d in deps if d != "bertkit"}
    return edges


def test_no_import_points_up():
    upward = []
    for module, deps in _modules().items():
        if module == "bertkit":
            continue
        for dep in deps:
            if _layer(dep) < _layer(module):
                upward.append(f"{module} -> {dep}")
    assert not upward, "imports pointing up the house: " + ", ".join(sorted(upward))


def test_no_import_cycles():
    edges = _modules()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep in edges and not state.get(dep):
                visit(dep, [*stack, dep])
        state[node] = 2

    for module in sorted(edges):
        if not state.get(module):
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(cycles)
