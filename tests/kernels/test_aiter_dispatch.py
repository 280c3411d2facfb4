"""The dispatch table picks the documented backend, with its reason, on hand-made platforms; nothing imports aiter."""
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from atomlite import LLM
from atomlite.cli import main
from atomlite.model_ops import dispatch, kernels
from atomlite.model_ops.aiter import detect
from atomlite.model_ops.platform import Platform, parse_platform

GFX950 = Platform("rocm", "gfx950", has_aiter=True)
GFX942 = Platform("rocm", "gfx942", has_aiter=True)
ROCM_NO_AITER = Platform("rocm", "gfx942", has_aiter=False)
CUDA = Platform("cuda", "sm_90")
CPU = Platform("cpu")
CK_LIMIT = "aiter: CK flash attention stops at head_dim 256"
FP4_LIMIT = "aiter: MXFP4 GEMM needs gfx950"
NO_TANH_GELU_MOE = "aiter: AITER's fused_moe has no tanh GELU"
REPO = Path(__file__).resolve().parents[2]

# Gemma 4's shapes (shared/docs/GEMMA4.md): sliding layers head_dim 256, global layers 512; plus an FP4 linear.
GEMMA4_SHAPES = (
    ("attention", dict(head_dim=256, window=True, gqa=2)),
    ("attention", dict(head_dim=512, window=False, gqa=8)),
    ("write_kv", dict(head_dim=256)),
    ("write_kv", dict(head_dim=512)),
    ("rms_norm", dict(dim=2560)),
    ("gelu_tanh_and_mul", dict(dim=10240)),
    ("moe_experts", dict(experts=128)),
    ("mxfp4_linear", dict(n=2560, k=10240, dynamic_input=True)),
)

# (platform, head_dim, expected backend, text the reason must contain)
ATTENTION = [
    (GFX950, 256, "aiter", "aiter on gfx950"), (GFX950, 512, "triton", CK_LIMIT),
    (GFX942, 256, "aiter", "aiter on gfx942"), (GFX942, 512, "triton", CK_LIMIT),
    (ROCM_NO_AITER, 256, "triton", "triton on rocm"), (ROCM_NO_AITER, 512, "triton", "triton on rocm"),
    (CUDA, 256, "triton", "triton on cuda"), (CUDA, 512, "triton", "triton on cuda"),
    (CPU, 256, "torch", "reference on cpu"), (CPU, 512, "torch", "reference on cpu"),
]
MXFP4 = [(GFX950, "aiter", "aiter on gfx950"), (GFX942, "triton", FP4_LIMIT),
         (ROCM_NO_AITER, "triton", "triton on rocm"), (CUDA, "triton", "triton on cuda"),
         (CPU, "torch", "reference on cpu")]


def plan_kernels(platform: Platform, shapes=GEMMA4_SHAPES) -> dict[tuple, dispatch.KernelChoice]:
    """(op, shape values) -> the kernel a layer of that shape gets when built for platform."""
    with dispatch.use(platform):
        return {(op, tuple(shape.values())): dispatch.choose(op, **shape) for op, shape in shapes}


@pytest.mark.parametrize("window", [True, False])
@pytest.mark.parametrize("platform,head_dim,expected,reason", ATTENTION)
def test_attention_backend_per_platform_and_head_dim(platform, head_dim, expected, reason, window):
    choice = dispatch.choose("attention", platform, "auto", head_dim=head_dim, window=window, gqa=2)
    assert (choice.backend, choice.fn.__module__.split(".")[2]) == (expected, {"aiter": "aiter", "triton": "triton",
                                                                             "torch": "torch_ref"}[expected])
    assert reason in choice.reason


# The vision towers' encoder attention (31B / 26B-A4B: 16 x 72; E2B / E4B: 12 x 64): (platform, dtype, expected
# backend, text the reason must contain)
ENCODER = [
    (GFX950, torch.bfloat16, "aiter", "aiter on gfx950"), (GFX942, torch.float16, "aiter", "aiter on gfx942"),
    (GFX942, torch.float32, "triton", "aiter: CK's flash attention forward takes bfloat16 or float16, not "
                                      "torch.float32"),
    (ROCM_NO_AITER, torch.bfloat16, "triton", "triton on rocm"), (CUDA, torch.bfloat16, "triton", "triton on cuda"),
    (CUDA, torch.float32, "triton", "triton on cuda"), (CPU, torch.bfloat16, "torch", "reference on cpu"),
]


@pytest.mark.parametrize("head_dim,gqa", [(72, 1), (64, 1)])
@pytest.mark.parametrize("platform,dtype,expected,reason", ENCODER)
def test_encoder_attention_backend_per_platform_and_dtype(platform, dtype, expected, reason, head_dim, gqa):
    choice = dispatch.choose("encoder_attention", platform, "auto", head_dim=head_dim, gqa=gqa, dtype=dtype)
    assert choice.backend == expected and reason in choice.reason
    assert choice.fn.__module__ == {"aiter": "atomlite.model_ops.aiter.encoder",
                                    "triton": "atomlite.model_ops.triton.attention.encoder",
                                    "torch": "atomlite.model_ops.torch_ref.encoder_attention"}[expected]
    assert choice.graph_safe


def test_encoder_attention_beyond_the_triton_tiles_falls_to_the_reference_and_says_why():
    choice = dispatch.choose("encoder_attention", CUDA, "auto", head_dim=256, gqa=1, dtype=torch.bfloat16)
    assert choice.backend == "torch" and "triton: head_dim 256 exceeds the encoder kernel's 128" in choice.reason


@pytest.mark.parametrize("platform,expected,reason", MXFP4)
def test_mxfp4_linear_uses_aiter_only_on_gfx950(platform, expected, reason):
    (row,) = plan_kernels(platform, shapes=(("mxfp4_linear", dict(n=2560, k=10240, dynamic_input=True)),)).values()
    assert row.backend == expected and reason in row.reason


def test_bf16_ops_on_aiter_platforms_and_what_falls_back():
    rows = plan_kernels(GFX942)
    for op in ("write_kv", "rms_norm", "gelu_tanh_and_mul"):
        assert all(r.backend == "aiter" for (o, _), r in rows.items() if o == op), op
    assert rows[("moe_experts", (128,))].backend != "aiter"


@pytest.mark.parametrize("platform", [GFX950, GFX942])
@pytest.mark.parametrize("op", ["moe_experts", "mxfp4_moe_experts"])
def test_moe_experts_run_on_triton_because_aiter_fused_moe_has_no_tanh_gelu(platform, op):
    choice = dispatch.choose(op, platform, "auto", experts=128, dtype=torch.bfloat16)
    assert choice.backend == "triton" and choice.fn.__module__.startswith("atomlite.model_ops.triton")
    assert NO_TANH_GELU_MOE in choice.reason and "gelu_tanh" in choice.reason
    assert "gelu_tanh" in kernels.refusal("aiter", op, platform, dict(experts=128, dtype=torch.bfloat16))


def test_plan_kernels_for_the_moe_model_on_gfx950_aiter_says_why_moe_is_not_on_aiter():
    result = CliRunner().invoke(main, ["plan", "--kernels", "--platform", "gfx950+aiter", "--model",
                                       str(REPO / "examples/configs/gemma-4-26B-A4B-it")])
    assert result.exit_code == 0, result.output
    (moe,) = [line for line in result.output.splitlines() if line.strip().startswith("moe_experts[")]
    assert ": triton (triton on rocm; " + NO_TANH_GELU_MOE in moe, moe
    assert "aiter" not in sys.modules


def test_limits_refuse_unsupported_shapes_and_archs():
    assert "divisible by 8" in kernels.refusal("aiter", "attention", GFX950, dict(head_dim=100))
    assert "divisible by 8" in kernels.refusal("aiter", "encoder_attention", GFX950, dict(head_dim=100))
    assert "gfx942/gfx950" in kernels.refusal("aiter", "rms_norm", Platform("rocm", "gfx90a", True), dict(dim=64))
    assert "weight-only" in kernels.refusal("aiter", "mxfp4_linear", GFX950, dict(n=32, dynamic_input=False))
    assert "divisible by 16" in kernels.refusal("aiter", "mxfp4_linear", GFX950, dict(n=40))


def test_hand_made_platform_availability_comes_from_the_pinned_signatures(monkeypatch):
    pinned = detect.pinned()
    trimmed = {v: {**p, "functions": {k: f for k, f in p["functions"].items() if k != "rmsnorm2d_fwd"}}
               for v, p in pinned.items()}
    monkeypatch.setattr(detect, "pinned", lambda: trimmed)
    assert kernels.refusal("aiter", "rms_norm", GFX950, dict(dim=64)) == "this AITER has no rmsnorm2d_fwd"
    choice = dispatch.choose("rms_norm", GFX950, "auto", dim=64)
    assert choice.backend == "triton" and "aiter: this AITER has no rmsnorm2d_fwd" in choice.reason


def test_a_failed_import_on_this_machine_falls_back_with_its_reason(monkeypatch):
    monkeypatch.setattr(detect, "local_platform", lambda: GFX950)
    monkeypatch.setitem(detect._state, "tried", True)
    monkeypatch.setitem(detect._state, "module", None)
    monkeypatch.setitem(detect._state, "error", "import aiter failed: RuntimeError: ROCm version file not found")
    choice = dispatch.choose("rms_norm", GFX950, "auto", dim=64)
    assert choice.backend == "triton" and "ROCm version file not found" in choice.reason


def test_this_cpu_machine_is_no_aiter_platform_and_nothing_imported_aiter():
    assert detect.local_platform() is None
    plan_kernels(GFX950)
    assert "aiter" not in sys.modules


@pytest.mark.parametrize("text,platform", [
    ("gfx950+aiter", GFX950), ("GFX942+aiter", GFX942), ("gfx942", ROCM_NO_AITER), ("sm_90", CUDA),
    ("cpu", CPU), ("rocm", Platform("rocm"))])
def test_parse_platform(text, platform):
    assert parse_platform(text) == platform


@pytest.mark.parametrize("text", ["cuda+aiter", "gfx950+rocm", "tpu"])
def test_parse_platform_rejects_what_cannot_exist(text):
    with pytest.raises(ValueError, match="--platform"):
        parse_platform(text)


def test_each_use_block_keeps_its_own_choices_and_a_what_if_records_none():
    with dispatch.use(GFX950) as engine:
        dispatch.choose("rms_norm", dim=64)
        dispatch.choose("rms_norm", CPU, dim=64)  # a what-if inside the block
        other = plan_kernels(CPU)  # another engine built while this one is
        dispatch.choose("attention", head_dim=512, window=False, gqa=8)
    assert sorted(engine.made) == ["attention[gqa=8,head_dim=512,window=False]", "rms_norm[dim=64]"]
    assert engine.made["rms_norm[dim=64]"].backend == "aiter"
    assert other[("rms_norm", (2560,))].backend == "torch"


def test_two_engines_keep_their_own_kernel_choices(random_model_dir):
    triton = LLM(str(random_model_dir), dtype="float32", device="cpu", kernel_backend="triton").engine
    torch_ref = LLM(str(random_model_dir), dtype="float32", device="cpu", kernel_backend="torch").engine
    assert triton.kernels.made and triton.kernels.made.keys() == torch_ref.kernels.made.keys()
    assert {c.backend for c in triton.kernels.made.values()} == {"triton"}
    assert {c.backend for c in torch_ref.kernels.made.values()} == {"torch"}
