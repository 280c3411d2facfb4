"""tools/aiter_signatures.py reads signatures the way Python resolves `aiter.<name>`, and the pinned file is current."""
import importlib.util
from pathlib import Path

from atomlite.model_ops.aiter import detect
from atomlite.model_ops.aiter.functions import all_paths

TOOL = Path(__file__).resolve().parents[2] / "tools/aiter_signatures.py"
spec = importlib.util.spec_from_file_location("aiter_signatures", TOOL)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

SOURCES = {
    "aiter/__init__.py": "import os\nif os.getenv('X'):\n    pass\nelse:\n    from .ops.old import *\n"
                         "    from .ops.new import *\n",
    "aiter/ops/old.py": "def norm(x, eps):\n    ...\n",
    "aiter/ops/new.py": "try:\n    import foo\nexcept ImportError:\n    pass\n"
                        "@decorated('m')\ndef norm(out, x, eps=1e-6, *, flag: bool = False, **kw) -> None:\n    ...\n",
    "aiter/utility/fp4_utils.py": "def quant(x, /, mode='even'):\n    ...\n",
    "aiter/dist/comm.py": "class Comm:\n    def __init__(self, group, device, max_size=8):\n        ...\n"
                          "    @contextmanager\n    def capture(self):\n        ...\n"
                          "    def reduce(self, input, quant=False):\n        ...\n",
}


def test_star_imports_resolve_to_the_last_definition():
    file, fn = tool.Tree(SOURCES).find("norm")
    assert file == "aiter/ops/new.py"
    described = tool.describe(fn)
    assert [(p["name"], p["kind"], p["default"]) for p in described["params"]] == [
        ("out", "positional_or_keyword", None), ("x", "positional_or_keyword", None),
        ("eps", "positional_or_keyword", "1e-06"), ("flag", "keyword_only", "False")]
    assert described["var_keyword"] and not described["var_positional"]


def test_dotted_paths_name_submodules():
    file, fn = tool.Tree(SOURCES).find("utility.fp4_utils.quant")
    assert file == "aiter/utility/fp4_utils.py"
    assert [p["kind"] for p in tool.describe(fn)["params"]] == ["positional_only", "positional_or_keyword"]
    assert tool.Tree(SOURCES).find("utility.fp4_utils.missing") is None


def test_a_class_pins_its_init_and_its_methods_without_self():
    tree = tool.Tree(SOURCES)
    file, init = tree.find("dist.comm.Comm")
    assert file == "aiter/dist/comm.py"
    assert [(p["name"], p["default"]) for p in tool.describe(init)["params"]] == [
        ("group", None), ("device", None), ("max_size", "8")]
    assert tool.describe(tree.find("dist.comm.Comm.capture")[1])["params"] == []
    assert [p["name"] for p in tool.describe(tree.find("dist.comm.Comm.reduce")[1])["params"]] == ["input", "quant"]
    assert tree.find("dist.comm.Comm.missing") is None and tree.find("dist.comm.Other.reduce") is None


def test_pinned_file_covers_every_function_the_adapter_calls():
    for version, pinned in detect.pinned().items():
        assert set(pinned["functions"]) == set(all_paths()), f"rerun tools/aiter_signatures.py ({version})"
    assert detect.ASSUMED_VERSION in detect.pinned()
