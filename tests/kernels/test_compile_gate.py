"""The ROCm compile gate: every Triton kernel specialization atomlite launches for the Gemma 4 configs compiles for
gfx942 and gfx950 (MI300X, MI355X) on this CPU machine. The gate compiles in child processes: these tests run
Triton in interpreter mode, which cannot compile."""
from pathlib import Path

import pytest

from atomlite.tools.compile_gate import failures, run_gate

ROCM = ["gfx942", "gfx950"]
GEMMA4_KERNELS = {
    "attention.paged._attention_kernel", "attention.paged._build_keys_kernel", "attention.split_kv._combine_kernel",
    "attention.qk_norm_rope._prepare_kernel", "norm.rms_norm._rms_norm_kernel", "norm.residual._norm_residual_kernel",
    "activation._gelu_tanh_and_mul_kernel",  # (no skinny GEMM: ROCm keeps hipBLASLt for bf16 linears)
    "mxfp4.gemm._mxfp4_gemm_kernel", "mxfp4.gemm._dequantize_kernel", "mxfp4.quant._quantize_dequantize_kernel",
    "moe.routing._count_kernel", "moe.routing._place_kernel", "moe.gemm._gate_up_kernel", "moe.gemm._down_kernel",
    "moe.gemv._gate_up_gemv_kernel", "moe.gemv._down_gemv_kernel", "moe.common._sum_slots_kernel",
    "moe.router._router_topk_kernel", "moe.router._router_kernel",
    "fp8.gemm.fp8_gemm_kernel", "fp8.moe.fp8_moe_gemm_kernel",  # FP8 checkpoints (compressed-tensors, Quark)
    "all_reduce._one_shot_all_reduce_kernel",  # tensor parallelism's decode all-reduce
    "attention.encoder._encoder_attention_kernel",  # the vision towers' encoder attention
    "attention.axial_norm_rope._axial_norm_rope_kernel"}  # and their attention inputs


@pytest.fixture(scope="module")
def rocm_results():
    return run_gate(ROCM)


def test_every_gemma4_specialization_compiles_for_gfx942_and_gfx950(rocm_results):
    assert not failures(rocm_results), "\n\n".join(failures(rocm_results))


def test_gate_compiles_every_kernel_gemma4_launches_on_rocm(rocm_results):
    for platform in ROCM:
        assert {r.kernel for r in rocm_results if r.platform == platform} == GEMMA4_KERNELS


@pytest.mark.parametrize("platform", ROCM)
def test_attention_at_gemma4_shapes_spills_no_vgprs(rocm_results, platform):
    attention = [r for r in rocm_results if r.platform == platform and r.kernel == "attention.paged._attention_kernel"]
    shapes = {(r.constexprs["HEAD_DIM"], r.constexprs["HAS_WINDOW"], r.constexprs["SPLIT_KV"]) for r in attention}
    assert shapes >= {(512, False, False), (256, True, False), (512, False, True), (256, True, True)}
    # k_eq_v global layers rebuild K from V: in the kernel at decode, once for the step (then read) at prefill
    assert {r.constexprs["HEAD_DIM"] for r in attention if r.constexprs["DERIVE_K"]} == {512}
    assert {r.constexprs["HEAD_DIM"] for r in attention if r.constexprs["KEYS_BUILT"]} == {512}
    spilled = [f"{r.describe()}: {r.stats}" for r in attention if r.stats["spills"]]
    assert not spilled, "\n".join(spilled)


@pytest.mark.parametrize("platform", ROCM)
def test_the_prefill_with_image_blocks_compiles_at_the_sliding_head_dim(rocm_results, platform):
    """31B and 26B-A4B (use_bidirectional_attention "vision"): their sliding layers' prefill with key ends, on a
    16-bit and an fp8 cache (ROCm tiles them apart); decode steps never carry key ends."""
    spans = [r for r in rocm_results if r.platform == platform and r.kernel == "attention.paged._attention_kernel"
             and r.constexprs["HAS_KEY_ENDS"]]
    assert {(r.constexprs["HEAD_DIM"], r.constexprs["HAS_WINDOW"], r.constexprs["SPLIT_KV"]) for r in spans} == {
        (256, True, False)}
    assert len({r.constexprs["BLOCK_M"] for r in spans}) == 2
    assert all("bidirectional_spans=True" in r.workload for r in spans)


@pytest.mark.parametrize("platform", ROCM)
def test_encoder_attention_compiles_at_both_tower_head_dims_and_spills_no_vgprs(rocm_results, platform):
    """The vision towers' encoder attention in bf16 at the largest step's images: 16 heads x 72 (31B, 26B-A4B; padded
    to 128, and split as 64 + 16 columns) and 12 x 64 (E2B, E4B; one part)."""
    encoder = [r for r in rocm_results if r.platform == platform
               and r.kernel == "attention.encoder._encoder_attention_kernel"]
    assert {(r.constexprs["HEAD_DIM"], r.constexprs["HEAD_MAIN"], r.constexprs["HEAD_TAIL"]) for r in encoder} == {
        (72, 128, 0), (72, 64, 16), (64, 64, 0)}
    assert all("tower images-" in r.workload and "dtype=torch.bfloat16" in r.workload for r in encoder)
    spilled = [f"{r.describe()}: {r.stats}" for r in encoder if r.stats["spills"]]
    assert not spilled, "\n".join(spilled)


def test_a_model_given_with_a_vision_tower_adds_its_encoder_attention():
    from atomlite.model_ops.platform import parse_platform
    from atomlite.tools.compile_gate.workloads import EXAMPLE_CONFIGS, gemma4_launches
    launches = gemma4_launches(parse_platform("gfx950"), [EXAMPLE_CONFIGS / "gemma-4-31B-it-vision"])
    encoder = [(workload, launch) for workload, launch in launches
               if launch.kernel.fn.__name__ == "_encoder_attention_kernel"]
    assert {workload.partition(" encoder_attention")[0] for workload, _ in encoder} == {
        "gemma-4-31B-it-vision tower images-1", "gemma-4-31B-it-vision tower images-2"}
    assert {(launch.kwargs["HEAD_DIM"], launch.grid[1]) for _, launch in encoder} == {(72, 16)}


def test_gate_reports_a_kernel_with_inline_ptx_by_name_on_gfx950():
    fixture = Path(__file__).with_name("compile_gate_ptx.py")
    results = run_gate(["gfx950"], launches=f"{fixture}:ptx_launches")
    assert [r.kernel for r in results] == ["compile_gate_ptx._ptx_kernel"]
    [message] = failures(results)
    assert message.startswith("gfx950: compile_gate_ptx._ptx_kernel[BLOCK=64; num_warps=1]")
    assert "invalid instruction" in message and results[0].stats is None


def test_the_residual_update_compiles_reading_rank_partials_at_two_and_eight_ranks(rocm_results):
    residual = [r for r in rocm_results if r.kernel == "norm.residual._norm_residual_kernel"]
    assert {(r.platform, r.constexprs["WORLD"], r.constexprs["PAIR"]) for r in residual} >= {
        (platform, world, pair) for platform in ROCM for world in (2, 8) for pair in (False, True)}
