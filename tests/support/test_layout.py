"""The package's shape: imports point down a declared layer order with no cycle, files stay small, and no
module reads an SFIBENCH_ environment variable.

The import graph is read from the sources with `ast` (every import statement, those inside functions
too), so a lazy import cannot hide an upward edge; only an `if TYPE_CHECKING:` block, read by type
checkers and never run, is left out. A node is a package under sfibench/ (`engine`,
`metrics`, ...) or a top-level module (`registry`, `cli`); `optimized/sfi.py`, SFI's optimized
method, is a node of its own in the methods layer while the rest of optimized/ are kernels, below models.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sfibench"

# Bottom to top. A node may import nodes of its own layer or below; a layer's nodes may import each other
# as long as no cycle forms (the cycle check below).
LAYERS = (
    ("sfibench", "core"),  # `sfibench` is the package's __init__ (its version string)
    ("optimized",),  # the Triton kernels and their torch oracles: nothing of models or methods
    ("models",),
    ("engine",),
    ("reference", "sfi", "optimized.sfi", "baselines"),  # the methods and their paths
    ("registry",),
    ("hf",),  # the methods inside a transformers model: the engine's pieces driven by transformers' forwards
    ("metrics",),
    ("workloads",),
    ("reporting",),
    ("runners",),
    ("commands",),
    ("cli",),
    ("__main__",),
)
LEVEL = {node: level for level, nodes in enumerate(LAYERS) for node in nodes}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(tree: ast.AST, name: str, is_package: bool, known: dict[str, Path]) -> set[str]:
    """The sfibench modules one module's source imports (a name imported from a package counts as its
    submodule when one of that name exists)."""
    found = set()
    skipped = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking(node.test)
               for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {target for target in found if target.split(".")[0] == "sfibench"}


def module_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = imported(tree, name, path.name == "__init__.py", known)
        # `import sfibench.a.b` names sfibench.a.b; keep the longest prefix that is a module of the package
        resolved = set()
        for target in targets:
            parts = target.split(".")
            while ".".join(parts) not in known:
                parts.pop()
            resolved.add(".".join(parts))
        graph[name] = resolved - {name}
    return graph


def node_of(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "sfibench"
    if parts[:2] == ["optimized", "sfi"]:
        return "optimized.sfi"
    return parts[0]


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, targets in module_graph().items():
        edges = graph.setdefault(node_of(module), set())
        edges.update(node_of(target) for target in targets if node_of(target) != node_of(module))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as the list of its nodes (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_packages():
    cycle = find_cycle(package_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_modules():
    cycle = find_cycle(module_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_package_has_a_layer():
    assert set(package_graph()) <= set(LEVEL), set(package_graph()) - set(LEVEL)


def test_imports_point_down_the_layers():
    upward = []
    for module, targets in sorted(module_graph().items()):
        for target in sorted(targets):
            source, sink = node_of(module), node_of(target)
            if LEVEL[sink] > LEVEL[source]:
                upward.append(f"{module} ({source}) imports {target} ({sink})")
    assert upward == []


def test_the_checks_catch_a_cycle_and_an_upward_edge():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert LEVEL["optimized"] < LEVEL["models"] < LEVEL["engine"] < LEVEL["optimized.sfi"]
    tree = ast.parse("def f():\n    from sfibench.models import fused\n")
    known = {"sfibench.models": PACKAGE, "sfibench.models.fused": PACKAGE}
    assert imported(tree, "sfibench.optimized.gemv", False, known) == {"sfibench.models.fused"}
    annotation_only = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sfibench.models\n")
    assert imported(annotation_only, "sfibench.optimized.gemv", False, known) == set()


def test_no_package_file_is_long():
    long = {module: n for module, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_sfibench_environment_switch_is_read():
    read = re.compile(r"(environ\b[^\n]*|getenv\([^\n]*)[\"']SFIBENCH_")
    found = [f"{module}: {match.group(0)}" for module, path in modules().items()
             for match in read.finditer(path.read_text())]
    assert found == []
