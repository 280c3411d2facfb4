"""Pin the signatures of the AITER functions atomlite calls, read from AITER's source with `ast` (never imported).

    python tools/aiter_signatures.py                       # pip-downloads amd-aiter==0.1.7.post2.dev18 (40 MB)
    python tools/aiter_signatures.py --wheel amd_aiter-....whl
    python tools/aiter_signatures.py --source /path/to/aiter-checkout --label e4048607
    (several --wheel/--source may be given; each becomes one pinned version)

Writes atomlite/model_ops/aiter/signatures.json: version -> function path -> parameters, where a function path is
what atomlite resolves at runtime: `name` for `aiter.name` (found by following the star-imports of aiter/__init__.py,
the last one wins, as in Python) or `sub.module.name` for `aiter.sub.module.name`. A class's path pins its __init__,
`sub.module.Class.method` a method; both without self.
"""
import argparse
import ast
import copy
import hashlib
import io
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from atomlite.model_ops.aiter.functions import all_paths  # noqa: E402

OUT = ROOT / "atomlite/model_ops/aiter/signatures.json"
PYPI_VERSION = "0.1.7.post2.dev18"


def module_statements(body):
    """Module-level statements, including those under module-level if/try blocks, in source order."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            for part in (node.body, node.orelse, getattr(node, "finalbody", [])):
                yield from module_statements(part)
            for handler in getattr(node, "handlers", []):
                yield from module_statements(handler.body)


def module_functions(source: str) -> dict[str, ast.FunctionDef]:
    """Module-level defs by name; a later def replaces an earlier one, as at import."""
    return {node.name: node for node in module_statements(ast.parse(source).body)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def module_classes(source: str) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in module_statements(ast.parse(source).body) if isinstance(node, ast.ClassDef)}


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    """A method of cls as an unbound-free signature: its first parameter (self) dropped."""
    fn = next((node for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and node.name == name), None)
    if fn is None:
        return None
    fn = copy.deepcopy(fn)
    (fn.args.posonlyargs or fn.args.args).pop(0)
    return fn


def star_imports(source: str) -> list[str]:
    """Relative modules star-imported by a package __init__, in source order ('.ops.mha' -> 'ops.mha')."""
    return [node.module for node in module_statements(ast.parse(source).body)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and any(a.name == "*" for a in node.names)]


def describe(fn: ast.FunctionDef) -> dict:
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [{"name": a.arg, "kind": "positional_only" if i < len(args.posonlyargs) else "positional_or_keyword",
               "default": None if d is None else ast.unparse(d)} for i, (a, d) in enumerate(zip(positional, defaults))]
    params += [{"name": a.arg, "kind": "keyword_only", "default": None if d is None else ast.unparse(d)}
               for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return {"params": params, "var_positional": args.vararg is not None, "var_keyword": args.kwarg is not None}


class Tree:
    """AITER's Python sources by relative path ('aiter/ops/mha.py'), from a wheel or a source checkout."""

    def __init__(self, files: dict[str, str]):
        self.files = files

    @classmethod
    def from_wheel(cls, data: bytes) -> "Tree":
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return cls({n: z.read(n).decode() for n in z.namelist() if n.startswith("aiter/") and n.endswith(".py")})

    @classmethod
    def from_dir(cls, root: Path) -> "Tree":
        return cls({str(p.relative_to(root)): p.read_text() for p in (root / "aiter").rglob("*.py")})

    def module_file(self, dotted: str) -> str | None:
        base = "aiter/" + dotted.replace(".", "/") if dotted else "aiter"
        for candidate in (base + ".py", base + "/__init__.py"):
            if candidate in self.files:
                return candidate
        return None

    def find(self, path: str) -> tuple[str, ast.FunctionDef] | None:
        """A function; a class (its __init__); or a class's method (`module.Class.method`). Methods without self."""
        module, _, name = path.rpartition(".")
        if module:
            file = self.module_file(module)
            if file:
                fn = module_functions(self.files[file]).get(name)
                cls = module_classes(self.files[file]).get(name)
                fn = fn or (cls and method(cls, "__init__"))
                return (file, fn) if fn else None
            module, _, class_name = module.rpartition(".")
            file = self.module_file(module)
            cls = file and module_classes(self.files[file]).get(class_name)
            fn = cls and method(cls, name)
            return (file, fn) if fn else None
        hit = None
        for dotted in star_imports(self.files["aiter/__init__.py"]):
            file = self.module_file(dotted)
            fn = file and module_functions(self.files[file]).get(name)
            if fn:
                hit = (file, fn)
        return hit


def pin(tree: Tree, source: str) -> dict:
    functions = {}
    for path in sorted(all_paths()):
        hit = tree.find(path)
        if hit:
            functions[path] = {"file": hit[0], **describe(hit[1])}
    return {"source": source, "functions": functions}


def download_wheel() -> tuple[bytes, str]:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        f"amd-aiter=={PYPI_VERSION}", "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        return wheel.read_bytes(), wheel.name


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheel", type=Path, action="append", default=[], help="an amd-aiter wheel file")
    parser.add_argument("--source", type=Path, action="append", default=[], help="an AITER source checkout")
    parser.add_argument("--label", action="append", default=[], help="version label of each --source, in order")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    versions = {}
    wheels = [(p.read_bytes(), p.name) for p in args.wheel] or ([] if args.source else [download_wheel()])
    for data, name in wheels:
        version = name.split("-")[1]
        versions[version] = pin(Tree.from_wheel(data), f"{name} sha256:{hashlib.sha256(data).hexdigest()}")
    for i, root in enumerate(args.source):
        label = args.label[i] if i < len(args.label) else root.name
        versions[label] = pin(Tree.from_dir(root), f"source tree {label}")
    for version, pinned in versions.items():
        missing = sorted(set(all_paths()) - set(pinned["functions"]))
        note = f", not found: {missing}" if missing else ""
        print(f"{version}: {len(pinned['functions'])} functions pinned{note}")
    document = {"generated_by": "tools/aiter_signatures.py", "versions": versions}
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
