"""FP8 checkpoints made by the producing tools (compressed-tensors 0.20.1, amd-quark 0.13) from tiny random Gemma 4s,
loaded by atomlite and compared with the tools' own quantized models (tests/fp8_producers.py, run once per session in
a subprocess). Weight-only checkpoints must match exactly; with activation quantization two correct implementations
part where a float32 rounding moves an activation across an e4m3 step, so they must match step for step until such
a flip, on most prompts; the mistakes that matter (per-tensor scales where the checkpoint says per token, one input
scale shared by the experts) must fail that."""
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from fp8_producers import CHECKPOINTS

TOLERANCE = 2e-3  # log-prob; the bound for weight-only parity
MOST = 4  # of the 6 prompts, for W8A8


@pytest.fixture(scope="session")
def fp8_dirs(tmp_path_factory) -> dict[str, Path]:
    for package in ("quark", "compressed_tensors"):
        if find_spec(package) is None:
            pytest.skip(f"{package} is not installed (pip install atomlite[test])")
    out = tmp_path_factory.mktemp("fp8")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    producer = Path(__file__).parents[1] / "fp8_producers.py"
    done = subprocess.run([sys.executable, str(producer), str(out), *CHECKPOINTS], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {name: out / name for name in CHECKPOINTS}


@dataclass
class PromptResult:
    same_tokens: bool  # atomlite's greedy continuation is the oracle's
    first_flip: int | None  # first scored position whose log-probs part by more than TOLERANCE; None: none does
    generated_from: int  # where the continuation starts (positions before are the prompt's)
    first_token_difference: int | None  # first generated position where the tokens differ


def compare(llm, ref: dict, prompts: int | None = None) -> list[PromptResult]:
    from atomlite import SamplingParams
    results = []
    for seq, logits in list(zip(ref["sequences"], ref["logits"]))[:prompts]:
        ids, start = seq.tolist(), ref["prompt_len"]
        vocab = logits.shape[-1]
        generated = llm.generate([ids[:start]], SamplingParams(temperature=0, max_tokens=len(ids) - start,
                                                               ignore_eos=True))[0].outputs[0].token_ids
        scored = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=vocab))[0]
        got = torch.tensor([[scored.prompt_logprobs[p][t] for t in range(vocab)] for p in range(1, len(ids))])
        diff = (got - torch.log_softmax(logits.float(), dim=-1)[:-1]).abs().amax(dim=-1)
        flips = (diff > TOLERANCE).nonzero()
        differ = [i for i, (a, b) in enumerate(zip(generated, ids[start:])) if a != b]
        results.append(PromptResult(list(generated) == ids[start:], int(flips[0]) + 1 if len(flips) else None, start,
                                    start + differ[0] if differ else None))
    return results


def assert_exact(results: list[PromptResult]) -> None:
    for i, r in enumerate(results):
        assert r.same_tokens and r.first_flip is None, f"prompt {i}: {r}"


def step_for_step(results: list[PromptResult]) -> bool:
    """Every prompt's greedy tokens agree at least until its first flip, and most prompts have none."""
    for r in results:
        if r.first_token_difference is not None and (r.first_flip is None or r.first_token_difference < r.first_flip):
            return False
    return sum(r.first_flip is None for r in results) >= min(MOST, len(results))


def load(path: Path, backend: str = "torch"):
    from atomlite import LLM
    return LLM(str(path), dtype="float32", device="cpu", kernel_backend=backend)


def fp8_layers(llm) -> list:
    from atomlite.model_ops.fp8_linear import FP8Linear
    from atomlite.model_ops.fp8_moe import FP8Experts
    return [m for m in llm.engine.model.modules() if isinstance(m, (FP8Linear, FP8Experts))]


@pytest.mark.parametrize("name", ["ct_w8a16_dense", "ct_w8a16_moe", "quark_w8a16_dense"])
def test_weight_only_checkpoints_match_their_oracle_exactly(fp8_dirs, name):
    llm = load(fp8_dirs[name])
    assert all(layer.spec.activation is None for layer in fp8_layers(llm))
    assert_exact(compare(llm, torch.load(fp8_dirs[name] / "reference.pt")))


@pytest.mark.parametrize("name", [n for n in CHECKPOINTS if "w8a16" not in n])
def test_w8a8_checkpoints_match_their_oracle_step_for_step(fp8_dirs, name):
    llm = load(fp8_dirs[name])
    layers = fp8_layers(llm)
    assert layers and all(layer.spec.activation is not None for layer in layers)
    assert ("moe" in name) == any(hasattr(layer, "num_experts") for layer in layers)
    results = compare(llm, torch.load(fp8_dirs[name] / "reference.pt"))
    assert step_for_step(results), results


@pytest.mark.parametrize("name", ["ct_dynamic_dense", "ct_block_dense", "quark_fp8_dense", "ct_w8a16_dense",
                                  "ct_dynamic_moe", "ct_block_moe", "quark_fp8_moe"])
def test_triton_fp8_kernels_match_the_oracle(fp8_dirs, name):
    """Per token, the residual updates write the next norm quantized for qkv and gate_up (TokenRows), and on a MoE
    layer the experts' input too; where the activations are quantized, the dense MLP's down projection computes
    gelu_tanh(gate) * up as it quantizes it (GatedInput)."""
    from atomlite.model_ops.activation import GeluTanhAndMul
    from atomlite.model_ops.norm import RMSNorm
    llm = load(fp8_dirs[name], "triton")
    assert {layer.backend for layer in fp8_layers(llm)} == {"triton"}
    norms = [m for m in llm.engine.model.modules() if isinstance(m, RMSNorm)]
    assert any(m.reader_quantization for m in norms) == name.startswith("ct_dynamic")
    assert any(m.last_reader_quantization for m in norms) == (name == "ct_dynamic_moe")
    activations = [m for m in llm.engine.model.modules() if isinstance(m, GeluTanhAndMul)]
    assert activations and all((m.reader_takes_gated is not None) == ("w8a16" not in name) for m in activations)
    results = compare(llm, torch.load(fp8_dirs[name] / "reference.pt"))
    assert step_for_step(results), results


@pytest.mark.parametrize("name", ["ct_dynamic_dense", "quark_ptpc_dense"])
def test_per_tensor_scales_where_the_checkpoint_says_per_token_fail(fp8_dirs, name, monkeypatch):
    from atomlite.quant import fp8
    real = fp8.dynamic_scales

    def per_tensor(x, activation, group_size=128):
        scales = real(x, activation, group_size)
        return torch.full_like(scales, scales.max().item()) if activation == "token" else scales
    monkeypatch.setattr(fp8, "dynamic_scales", per_tensor)
    results = compare(load(fp8_dirs[name]), torch.load(fp8_dirs[name] / "reference.pt"))
    assert not step_for_step(results), results


def test_one_input_scale_shared_by_the_experts_fails(fp8_dirs, monkeypatch):
    """Quark's static fp8 MoE: each expert has its own input scale; the largest over experts is another model."""
    from atomlite.model_ops.fp8_moe import FP8Experts
    real = FP8Experts.process_after_loading

    def shared(self):
        for name in ("gate_up_proj_input_scale", "down_proj_input_scale"):
            param = getattr(self, name)
            param.data[:] = param.data.max()
        real(self)
    monkeypatch.setattr(FP8Experts, "process_after_loading", shared)
    path = fp8_dirs["quark_fp8_moe"]
    results = compare(load(path), torch.load(path / "reference.pt"))
    assert not step_for_step(results), results


def test_fused_projections_keep_each_shards_weight_scale(fp8_dirs):
    """Quark's per-tensor fp8: q, k and v share one input_scale and keep their own weight_scale; the fused qkv
    holds each shard's scale on its rows."""
    from safetensors.torch import load_file
    path = fp8_dirs["quark_fp8_dense"]
    tensors = load_file(path / "model.safetensors")
    prefix = "model.layers.0.self_attn"
    scales = [tensors[f"{prefix}.{p}_proj.weight_scale"].item() for p in "qkv"]
    assert len(set(scales)) == 3
    assert len({tensors[f"{prefix}.{p}_proj.input_scale"].item() for p in "qkv"}) == 1
    qkv = load(path).engine.model.model.layers[0].self_attn.qkv_proj
    for scale, offset, size in zip(scales, qkv.shard_offsets, qkv.shard_sizes):
        assert torch.all(qkv.weight_scale[offset:offset + size] == scale)


def test_block_checkpoint_has_partial_blocks(fp8_dirs):
    """FP8-block keeps weights unpadded: k_proj's 64 rows and a K of 88 are partial 128-blocks."""
    from safetensors.torch import load_file
    dense = load_file(fp8_dirs["ct_block_dense"] / "model.safetensors")
    assert dense["model.layers.0.self_attn.k_proj.weight"].shape == (64, 128)
    assert dense["model.layers.0.self_attn.k_proj.weight_scale"].shape == (1, 1)
    moe = load_file(fp8_dirs["ct_w8a16_moe"] / "model.safetensors")
    assert moe["model.layers.0.experts.0.down_proj.weight"].shape == (64, 88)
    assert moe["model.layers.0.experts.0.down_proj.weight_scale"].shape == (1, 1)
