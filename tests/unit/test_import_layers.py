"""The layering shows in the imports: no two atomlite packages import each other (directly or through others), and
no two server modules do; models do not reach into the engine; layers reach kernels only through dispatch, which
alone names backends; Triton kernels borrow nothing from the torch reference; the server talks to the engine through
its public interface. Imports inside functions count too: a lazy import is still a dependency."""
import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2] / "atomlite"
MODEL_OPS = ROOT / "model_ops"
DISPATCH = MODEL_OPS / "dispatch.py"
KERNEL_PACKAGES = ("atomlite.model_ops.triton", "atomlite.model_ops.aiter", "atomlite.model_ops.torch_ref")
# The atomlite.engine modules the server imports today; the public engine interface is meant to be all of them.
SERVER_MAY_IMPORT = {"atomlite.engine.ipc.client"}


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
    assert "atomlite.server.app" in graph["atomlite.commands.serve"]  # imported inside `serve`


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def imports_from(paths: list[Path], packages: tuple[str, ...], imports=None) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports, for each of paths that imports any."""
    found = {}
    for path in paths:
        hits = {name for name in (imports or imported_modules)(path) if any(within(name, p) for p in packages)}
        if hits:
            found[module_name(path)] = hits
    return found


def imported_targets(path: Path) -> set[str]:
    """Like imported_modules, but `from pkg import module` counts as pkg.module alone (not pkg as well)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = {f"{node.module}.{alias.name}" for alias in node.names if is_module(f"{node.module}.{alias.name}")}
            found |= modules if len(modules) == len(node.names) else modules | {node.module}
    return {name for name in found if name.split(".")[0] == "atomlite"}


def model_files() -> list[Path]:
    return sorted((ROOT / "models").rglob("*.py"))


def layer_files() -> list[Path]:
    """The layers: atomlite/model_ops/*.py but dispatch (which picks the kernels), and the models."""
    return sorted(path for path in MODEL_OPS.glob("*.py") if path != DISPATCH) + model_files()


def test_models_do_not_import_the_engine():
    found = imports_from(model_files(), ("atomlite.engine",))
    assert found == {}, f"models declare what the engine reads; they import none of it: {found}"


def test_triton_kernels_do_not_import_the_torch_reference():
    """Shared constants and types live in neutral model_ops modules (kv_spec, context), not in the reference."""
    found = imports_from(sorted((MODEL_OPS / "triton").rglob("*.py")), ("atomlite.model_ops.torch_ref",))
    assert found == {}, f"Triton kernels import the torch reference: {found}"


def test_layers_reach_kernels_only_through_dispatch():
    found = imports_from(layer_files(), KERNEL_PACKAGES)
    assert found == {}, f"layers import kernel backends (dispatch.py picks them): {found}"


def test_server_imports_the_engine_through_its_interface():
    found = imports_from(sorted((ROOT / "server").rglob("*.py")), ("atomlite.engine",), imported_targets)
    beyond = {module: hits - SERVER_MAY_IMPORT for module, hits in found.items() if hits - SERVER_MAY_IMPORT}
    assert beyond == {}, f"server modules import engine modules beyond {sorted(SERVER_MAY_IMPORT)}: {beyond}"


def _names_backend(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "backend") or (
        isinstance(node, ast.Attribute) and node.attr == "backend")


def _is_string(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def backend_comparisons(source: str) -> list[int]:
    """Lines where `backend` (a name or an attribute) is compared (== or !=) with a string."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, sides, sides[1:]):
                if isinstance(op, (ast.Eq, ast.NotEq)) and (
                        (_names_backend(a) and _is_string(b)) or (_names_backend(b) and _is_string(a))):
                    lines.append(node.lineno)
    return lines


def test_only_dispatch_compares_backend_names():
    found = [f"{path.relative_to(ROOT.parent)}:{line}" for path in sorted(ROOT.rglob("*.py")) if path != DISPATCH
             for line in backend_comparisons(path.read_text())]
    assert found == [], f"backend names are compared in atomlite/model_ops/dispatch.py alone, not at {found}"


def test_backend_comparison_finder_sees_every_form():
    source = 'a = backend == "triton"\nb = "aiter" != self.backend\nc = x < 1 == layer.backend == "torch"\n'
    assert backend_comparisons(source) == [1, 2, 3]
    assert backend_comparisons('backend = "triton"\nok = backend in BACKENDS\nn = name == "triton"\n') == []


def test_the_runtime_package_imports_nothing_from_the_repositorys_tools():
    """The demo's training lives in tools/demo_training/, outside the package serve installs: nothing in atomlite may
    need it."""
    reaching = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                     else [])
            reaching += [f"{module_name(path)} -> {name}" for name in names if name.split(".")[0] == "tools"]
    assert reaching == []
    assert not list((ROOT / "demo").glob("train*.py"))
