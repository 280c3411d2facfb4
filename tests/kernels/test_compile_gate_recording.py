"""What the compile gate records is what the real models launch: each config built on the meta device as the engine
builds it and run at the engine's default steps (atomlite/tools/compile_gate/recording.py). The launches are
recorded here, in this process; compiling them is tests/kernels/test_compile_gate.py's."""
from collections import defaultdict

import pytest

from atomlite.model_ops.platform import parse_platform
from atomlite.tools.compile_gate.recording import EXAMPLE_CONFIGS, example_configs, record

VISION = EXAMPLE_CONFIGS / "gemma-4-31B-it-vision"


def by_kernel(launches) -> dict[str, list]:
    found = defaultdict(list)
    for workload, launch in launches:
        found[launch.kernel.fn.__name__].append((workload, launch))
    return found


def test_every_example_config_is_recorded():
    names = {path.name for path in example_configs()}
    assert {"gemma-4-31B-it", "gemma-4-26B-A4B-it", "gemma-4-E2B-it", "gemma-4-E4B-it", "gemma-4-31B-it-vision",
            "gemma-4-31B-it-mxfp4", "gemma-4-26B-A4B-it-mxfp4", "gemma-4-26B-A4B-it-fp8-block",
            "gemma-4-31B-it-assistant", "gemma-4-26B-A4B-it-assistant", "gemma-4-E4B-it-assistant",
            "gemma-3-27b-it"} <= names


@pytest.mark.parametrize("name,heads", [("gemma-4-31B-it-assistant", 32), ("gemma-4-E4B-it-assistant", 4)])
def test_an_assistant_records_the_targets_verify_steps_and_its_draft_rounds(name, heads):
    """Beside its target (the folder without -assistant): the target's steps of 1 + NUM_DRAFTS queries a sequence,
    eager and from every verify graph, and the assistant's rounds of NUM_DRAFTS steps, eager and from every draft
    graph, whose attention reads the target's caches (sliding 256 and global 512 heads) with the assistant's own
    query heads."""
    launches = record(parse_platform("gfx950"), [EXAMPLE_CONFIGS / name])
    steps = {workload.removeprefix(f"{name} kv bfloat16 ").rstrip("0123456789") for workload, _ in launches}
    assert {"verify-", "verify graph ", "draft-", "draft graph "} <= steps
    draft_attention = {(launch.kwargs["HEAD_DIM"], launch.kwargs["GROUP"] * launch.grid[1]) for workload, launch
                       in by_kernel(launches)["_attention_kernel"] if " draft" in workload}
    assert draft_attention == {(256, heads), (512, heads)}  # query heads = GROUP x the target's KV heads (grid)


def test_prefill_graphs_are_recorded_with_keys_built_on_the_device():
    """Every prefill graph bucket: the global (V-only) layers build the prefilling sequences' keys on the device,
    then attend twice, over the built keys and deriving the rest."""
    launches = by_kernel(record(parse_platform("gfx950"), [EXAMPLE_CONFIGS / "gemma-4-26B-A4B-it"]))
    builds = {workload.rsplit(" ", 1)[-1] for workload, _ in launches["_build_step_keys_kernel"]}
    assert "16" in builds and len(builds) > 6
    assert all(" prefill graph " in workload for workload, _ in launches["_build_step_keys_kernel"])
    partial = {(launch.kwargs["KEYS_BUILT"], launch.kwargs["DERIVE_K"]) for workload, launch
               in launches["_attention_kernel"] if launch.kwargs.get("SOME_BUILT")}
    assert partial == {(True, False), (False, True)}


@pytest.fixture(scope="module")
def vision_on_gfx950():
    return by_kernel(record(parse_platform("gfx950"), [VISION]))


def test_a_model_with_a_vision_tower_records_its_encoder_attention_at_every_tower_graph(vision_on_gfx950):
    encoder = vision_on_gfx950["_encoder_attention_kernel"]
    buckets = {workload.removeprefix("gemma-4-31B-it-vision tower graph ") for workload, _ in encoder}
    assert "64" in buckets and len(buckets) > 2
    assert {(launch.kwargs["HEAD_DIM"], launch.grid[1]) for _, launch in encoder} == {(72, 16)}


def test_only_prefills_with_an_image_carry_key_ends(vision_on_gfx950):
    spans = [workload for workload, launch in vision_on_gfx950["_attention_kernel"] if launch.kwargs["HAS_KEY_ENDS"]]
    assert spans and all("prefill" in workload and "with an image" in workload for workload in spans)


def test_decode_graphs_and_the_fp8_cache_are_recorded(vision_on_gfx950):
    workloads = {workload for workload, _ in vision_on_gfx950["_attention_kernel"]}
    for kv in ("kv bfloat16", "kv float8_e4m3fn"):
        assert {f"gemma-4-31B-it-vision {kv} decode graph {b}" for b in (1, 8, 64)} <= workloads


@pytest.mark.parametrize("platform,ranks", [("sm_90", {2, 8}), ("gfx950", set())])
def test_tensor_parallel_all_reduce_is_recorded_where_dispatch_gives_the_platform_one(platform, ranks):
    """On NVIDIA the graphs of rank 0 of 2 and of 8 sum through the one-shot kernel and the residual update reads
    the ranks' shares; dispatch gives ROCm no Triton all-reduce (AITER's, or the collective library)."""
    kernels = by_kernel(record(parse_platform(platform), [EXAMPLE_CONFIGS / "gemma-4-E2B-it"]))
    assert {launch.kwargs["WORLD"] for _, launch in kernels["_one_shot_all_reduce_kernel"]} == ranks
    reading = {launch.kwargs["WORLD"] for _, launch in kernels["_norm_residual_kernel"]} - {1}
    assert reading == ranks


def test_two_ranks_sum_a_moe_layers_branches_in_one_exchange_in_prefill_graphs():
    """26B-A4B as rank 0 of 2 on NVIDIA: its prefill graphs' all-reduces go through the one-shot kernel, a MoE
    layer's two branches as a pair (no stack); decode graphs hand the shares to the residual update instead."""
    kernels = by_kernel(record(parse_platform("sm_90"), [EXAMPLE_CONFIGS / "gemma-4-26B-A4B-it"]))
    pairs = {workload for workload, launch in kernels["_one_shot_all_reduce_kernel"]
             if launch.kwargs["WORLD"] == 2 and launch.kwargs["PAIR"]}
    assert pairs and all("rank 0 of 2" in workload and "prefill graph" in workload for workload in pairs)


def test_unquantized_models_record_the_lora_kernels_and_quantized_ones_none():
    """--enable-lora attaches adapter slots to unquantized projections: their shrink and expand launch in prefill
    and every decode graph; MXFP4 projections take no adapters."""
    launches = by_kernel(record(parse_platform("gfx942"), [EXAMPLE_CONFIGS / "gemma-4-31B-it",
                                                           EXAMPLE_CONFIGS / "gemma-4-31B-it-mxfp4"]))
    for kernel in ("_shrink_kernel", "_expand_kernel"):
        workloads = {workload for workload, _ in launches[kernel]}
        assert "gemma-4-31B-it lora prefill" in workloads and "gemma-4-31B-it lora decode graph 1" in workloads
        assert not any("mxfp4" in workload for workload in workloads)


def test_mxfp4_weight_copies_are_recorded_where_the_gpu_has_fp8_tensor_cores():
    """31B MXFP4 on sm_90 keeps e4m3 weight copies (as a GPU with the memory for them): its steps of 65+ rows fold
    their activations and run the FP8 GEMM, its decode graphs of up to 64 keep the packed weight's kernels; gfx942
    makes no copies."""
    model = [EXAMPLE_CONFIGS / "gemma-4-31B-it-mxfp4"]
    nvidia = by_kernel(record(parse_platform("sm_90"), model))
    folds = {workload for workload, _ in nvidia["_fold_rows_kernel"]}
    assert folds and "fp8_gemm_kernel" in nvidia
    assert not [w for w in folds if " decode graph " in w and int(w.rsplit(" ", 1)[1]) <= 64]
    assert "_fold_rows_kernel" not in by_kernel(record(parse_platform("gfx942"), model))
