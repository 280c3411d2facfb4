"""The ROCm compile gate: every Triton kernel specialization the models of examples/configs launch (recorded from
their own forward at the engine's default steps) compiles for gfx942 and gfx950 (MI300X, MI355X) on this CPU machine.
The gate compiles in child processes: these tests run Triton in interpreter mode, which cannot compile."""
from dataclasses import replace
from pathlib import Path

import pytest

from atomlite.tools.compile_gate import failures, run_gate, uncompiled

ROCM = ["gfx942", "gfx950"]
# Attention tiles that spill as the models launch them, with a KV pool beyond 2 GiB as every real pool is (no buffer
# ops on the cache; a gate with a small pool did not see them): (platform, HEAD_DIM, BLOCK_Q, HAS_KEY_ENDS) -> the
# VGPRs spilled. Tiles to retune on the GPU, where the change can be timed; any other spill fails.
KNOWN_SPILLS = {("gfx950", 256, 32, True): 1,  # the sliding layers' prefill with an image's key ends
                ("gfx942", 256, 8, False): 2,  # the sliding layers' eager decode of 64 sequences
                ("gfx942", 128, 64, False): 82,  # Gemma 3 27B's prefill (BLOCK_M 128, 8 warps, 3 stages)
                ("gfx950", 128, 64, False): 31}  # the same tile


@pytest.fixture(scope="module")
def rocm_gate():
    return run_gate(ROCM)


@pytest.fixture(scope="module")
def rocm_results(rocm_gate):
    return rocm_gate.results


def test_every_recorded_specialization_compiles_for_gfx942_and_gfx950(rocm_gate):
    assert not failures(rocm_gate), "\n\n".join(failures(rocm_gate))


def test_the_gate_compiles_exactly_what_the_models_launch(rocm_gate):
    recorded = {(r["platform"], r["key"]) for r in rocm_gate.recorded}
    assert {(r.platform, r.key) for r in rocm_gate.results} == recorded
    for platform in ROCM:  # the configs' kernel families: bf16, MoE, MXFP4, FP8 and the vision tower
        families = {r["kernel"].partition(".")[0] for r in rocm_gate.recorded if r["platform"] == platform}
        assert families == {"attention", "norm", "activation", "gemm", "moe", "mxfp4", "fp8", "lora"}


def test_the_gate_compiles_what_e4b_the_assistants_and_gemma3_add(rocm_gate):
    """Specializations first launched (in examples/configs' order) by Gemma 4 E4B (its GQA group of 4), by
    speculative decoding with an assistant (its draft rounds) and by Gemma 3 27B (head_dim 128) are among those the
    gate compiles. (The 26B-A4B target's verify steps launch nothing its prefill graph buckets have not: that
    they are recorded is test_compile_gate_recording's.)"""
    for platform in ROCM:
        first = {r.workload for r in rocm_gate.results if r.platform == platform}
        assert any(w.startswith("gemma-4-E4B-it kv") for w in first)
        assert any(w.startswith("gemma-4-E4B-it-assistant") and " draft" in w for w in first)
        assert any(w.startswith("gemma-3-27b-it") for w in first)


def test_the_gate_fails_when_a_recorded_specialization_is_not_compiled(rocm_gate):
    dropped, *kept = rocm_gate.results
    short = replace(rocm_gate, results=kept)
    [message] = uncompiled(short)
    assert message.startswith(f"{dropped.platform}: {dropped.kernel}[") and "not compiled" in message
    assert message in failures(short)


@pytest.mark.parametrize("platform", ROCM)
def test_attention_at_gemma4_shapes_spills_no_vgprs(rocm_results, platform):
    attention = [r for r in rocm_results if r.platform == platform and r.kernel == "attention.paged._attention_kernel"]
    shapes = {(r.constexprs["HEAD_DIM"], r.constexprs["HAS_WINDOW"], r.constexprs["SPLIT_KV"]) for r in attention}
    assert shapes >= {(512, False, False), (256, True, False), (512, False, True), (256, True, True)}
    # k_eq_v global layers rebuild K from V: in the kernel at decode, once for the step (then read) at prefill
    assert {r.constexprs["HEAD_DIM"] for r in attention if r.constexprs["DERIVE_K"]} == {512}
    assert {r.constexprs["HEAD_DIM"] for r in attention if r.constexprs["KEYS_BUILT"]} == {512}
    known = {tuple(key): vgprs for (where, *key), vgprs in KNOWN_SPILLS.items() if where == platform}
    spilled = [f"{r.describe()}: {r.stats}" for r in attention if r.stats["spills"] > known.get(
        (r.constexprs["HEAD_DIM"], r.constexprs["BLOCK_Q"], r.constexprs["HAS_KEY_ENDS"]), 0)]
    assert not spilled, "\n".join(spilled)


@pytest.mark.parametrize("platform", ROCM)
def test_fp8_kernels_spill_no_vgprs(rocm_results, platform):
    """The FP8 configs' fp8_linear and fp8_moe_experts launches (dynamic per token, per group of 128, static per
    tensor), on gfx942's e4m3fnuz weights and gfx950's e4m3fn."""
    fp8 = [r for r in rocm_results if r.platform == platform and r.kernel.startswith("fp8.")]
    assert {r.kernel for r in fp8} >= {"fp8.gemm.fp8_gemm_kernel", "fp8.moe.fp8_moe_gemm_kernel"}
    spilled = [f"{r.describe()}: {r.stats}" for r in fp8 if (r.stats or {}).get("spills")]
    assert not spilled, "\n".join(spilled)


@pytest.mark.parametrize("platform", ROCM)
def test_the_prefill_with_image_blocks_compiles_at_the_sliding_head_dim(rocm_results, platform):
    """31B with its vision tower (use_bidirectional_attention "vision"): its sliding layers' prefill with key ends,
    on a 16-bit and an fp8 cache (ROCm tiles them apart); decode steps never carry key ends, nor models without a
    tower."""
    spans = [r for r in rocm_results if r.platform == platform and r.kernel == "attention.paged._attention_kernel"
             and r.constexprs["HAS_KEY_ENDS"]]
    assert {(r.constexprs["HEAD_DIM"], r.constexprs["HAS_WINDOW"], r.constexprs["SPLIT_KV"]) for r in spans} == {
        (256, True, False)}
    assert len({r.constexprs["BLOCK_M"] for r in spans}) == 2
    assert all(r.workload.startswith("gemma-4-31B-it-vision") and "with an image" in r.workload for r in spans)


@pytest.mark.parametrize("platform", ROCM)
def test_encoder_attention_compiles_at_the_towers_head_dim_and_spills_no_vgprs(platform, rocm_results):
    """The 31B tower's encoder attention (16 heads x 72, padded to 128) in bf16 at every tower graph's bucket."""
    encoder = [r for r in rocm_results if r.platform == platform
               and r.kernel == "attention.encoder._encoder_attention_kernel"]
    assert {(r.constexprs["HEAD_DIM"], r.constexprs["HEAD_MAIN"]) for r in encoder} == {(72, 128)}
    assert all(r.workload.startswith("gemma-4-31B-it-vision tower graph") for r in encoder)
    spilled = [f"{r.describe()}: {r.stats}" for r in encoder if r.stats["spills"]]
    assert not spilled, "\n".join(spilled)


def test_gate_reports_a_kernel_with_inline_ptx_by_name_on_gfx950():
    fixture = Path(__file__).with_name("compile_gate_ptx.py")
    run = run_gate(["gfx950"], launches=f"{fixture}:ptx_launches")
    results = run.results
    assert [r.kernel for r in results] == ["compile_gate_ptx._ptx_kernel"]
    [message] = failures(run)
    assert message.startswith("gfx950: compile_gate_ptx._ptx_kernel[BLOCK=64; num_warps=1]")
    assert "invalid instruction" in message and results[0].stats is None
