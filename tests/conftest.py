import os
import sys

import torch

# Triton fixes interpreter mode at its first import: decide before anything imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("TRITON_INTERPRET") == "1":
    import interpreter_calls  # noqa: E402
    interpreter_calls.install()  # the interpreter's kernels, without re-patching triton.language at every helper call

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import tiny_models  # noqa: E402
from random_model import build_random_model  # noqa: E402

SLOW_FILES = {"test_compile_gate.py", "test_accuracy.py", "test_quark_reference.py", "test_demo_train.py",
              "test_demo_train_vision.py"}


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip where no CUDA/HIP GPU is; the files that dominate `make test` carry `slow`
    (`pytest -m "not slow"` for a quick pass)."""
    no_gpu = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA/HIP GPU")
    for item in items:
        if no_gpu is not None and item.get_closest_marker("gpu"):
            item.add_marker(no_gpu)
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


class Checkpoints:
    """Tiny transformers checkpoints built once per test session: (folder, float32 reference model)."""

    def __init__(self, root: Path):
        self.root, self.cache = root, {}

    def get(self, variant: str = "dense", multimodal: bool = False, per_layer_form: bool = True, **overrides):
        key = (variant, multimodal, per_layer_form, tuple(sorted(overrides.items())))
        if key not in self.cache:
            out = self.root / f"{variant}-{len(self.cache)}"
            self.cache[key] = (out, tiny_models.build(variant, out, multimodal=multimodal,
                                                      per_layer_form=per_layer_form, **overrides))
        return self.cache[key]

    def gemma3(self, variant: str = "gemma3", hub_form: bool = False, multimodal: bool = False, **overrides):
        """A tiny Gemma3ForCausalLM (tiny_models.GEMMA3_VARIANTS; multimodal: Gemma3ForConditionalGeneration):
        (folder, float32 reference model)."""
        key = ("gemma3", variant, hub_form, multimodal, tuple(sorted(overrides.items())))
        if key not in self.cache:
            out = self.root / f"{variant}-{len(self.cache)}"
            self.cache[key] = (out, tiny_models.build_gemma3(variant, out, hub_form=hub_form, multimodal=multimodal,
                                                             **overrides))
        return self.cache[key]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory) -> Path:
    """A tiny random Gemma 4 with the char tokenizer and chat template (text in, text out)."""
    path = tmp_path_factory.mktemp("random") / "tiny"
    build_random_model(path)
    return path
