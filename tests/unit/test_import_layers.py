"""The layering shows in the imports: no two atomlite packages import each other (directly or through others), and
no two server modules do. Imports inside functions count too: a lazy import is still a dependency."""
import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2] / "atomlite"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imported_modules(path: Path) -> set[str]:
    """Every atomlite module that path imports; `from pkg import name` counts as pkg.name when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names
                      if is_module(f"{node.module}.{alias.name}")}
    return {name for name in found if name.split(".")[0] == "atomlite"}


def module_graph() -> dict[str, set[str]]:
    return {module_name(path): imported_modules(path) for path in ROOT.rglob("*.py")}


def grouped(graph: dict[str, set[str]], group) -> dict[str, set[str]]:
    """The graph between groups of modules (group(module) -> its group, or None to leave it out)."""
    edges = defaultdict(set)
    for source, targets in graph.items():
        for target in targets:
            a, b = group(source), group(target)
            if a is not None and b is not None and a != b:
                edges[a].add(b)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None when the graph is acyclic."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_of(module: str) -> str | None:
    """atomlite.model_ops.triton.norm.rms_norm -> model_ops; top-level modules (atomlite.config) are their own group."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def server_module(module: str) -> str | None:
    return module if module.startswith("atomlite.server.") else None


@pytest.mark.parametrize("group", [package_of, server_module], ids=["packages", "server-modules"])
def test_imports_run_one_way(group):
    cycle = find_cycle(grouped(module_graph(), group))
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_cycle_finder_sees_a_cycle_through_a_third_module():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}}) is None


def test_lazy_and_from_imports_are_seen():
    graph = module_graph()
    assert "atomlite.model_ops.dispatch" in graph["atomlite.model_ops.norm"]
    assert "atomlite.server.app" in graph["atomlite.cli"]  # imported inside `serve`
