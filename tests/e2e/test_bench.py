"""`--load-format dummy` and `atomlite bench`: random weights from config.json alone, each benchmark's table and JSON,
and the roofline arithmetic they print beside their results."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from atomlite import LLM
from atomlite.benchmarks.images import vision_tower_flops
from atomlite.benchmarks.roofline import kv_bytes_read, logits_bytes, weight_bytes_read
from atomlite.cli import main
from atomlite.config import EngineConfig
from atomlite.demo import DEMO_ASSISTANT_DIR, DEMO_DIR
from atomlite.model_ops.platform import Platform
from atomlite.plan import meta_model
from helpers import greedy, random_prompt
from server_utils import running
from quark_configs import quark_config

EXAMPLES = "examples/configs"


@pytest.fixture(scope="module")
def config_only(checkpoints, tmp_path_factory):
    """The tiny dense model's folder with config.json and nothing else."""
    path, _ = checkpoints.get("dense")
    out = tmp_path_factory.mktemp("config-only")
    shutil.copy(path / "config.json", out / "config.json")
    return out


def test_dummy_weights_run_from_config_alone(config_only):
    llm = LLM(str(config_only), load_format="dummy", dtype="float32", device="cpu")
    params = dict(llm.engine.model.named_parameters())
    assert torch.all(params["model.layers.0.input_layernorm.weight"] == 1)
    assert params["model.layers.0.mlp.down_proj.weight"].std().item() == pytest.approx(0.02, rel=0.1)
    again = LLM(str(config_only), load_format="dummy", dtype="float32", device="cpu")
    prompt = random_prompt(9, seed=1)
    tokens = llm.generate([prompt], greedy(6))[0].outputs[0].token_ids
    assert len(tokens) == 6 and tokens == again.generate([prompt], greedy(6))[0].outputs[0].token_ids  # seeded


def test_dummy_mxfp4_weights_have_real_shapes_and_finite_outputs(config_only, tmp_path):
    raw = json.loads((config_only / "config.json").read_text())
    raw["quantization_config"] = quark_config()["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    llm = LLM(str(tmp_path), load_format="dummy", dtype="float32", device="cpu")
    proj = llm.engine.model.model.layers[0].mlp.down_proj
    assert proj.weight.dtype == torch.uint8 and proj.weight.shape == (64, 48)
    scales = proj.weight_scale.flatten()
    assert 116 <= scales.min().item() and scales.max().item() < 123  # e8m0 in range, never the NaN code 255
    hidden = llm.engine.model.model.layers[0].mlp(torch.randn(3, 64))
    assert torch.isfinite(hidden).all()
    assert len(llm.generate([random_prompt(5, seed=2)], greedy(3))[0].outputs[0].token_ids) == 3


def test_bench_latency_prints_its_table_and_writes_json(config_only, tmp_path):
    out = tmp_path / "latency.json"
    result = CliRunner().invoke(main, ["bench", "latency", "--model", str(config_only), "--load-format", "dummy",
                                       "--device", "cpu", "--input-len", "16", "--output-len", "4",
                                       "--batch-size", "3", "--repeats", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "TTFT, 16-token prompt" in result.output and "TPOT, batch 3" in result.output
    report = json.loads(out.read_text())
    assert [r["metric"] for r in report["results"]] == ["TTFT, 16-token prompt", "TPOT, batch 1", "TPOT, batch 3"]
    for row in report["results"]:
        assert row["ms"] > 0 and row["roofline_ms"] > 0
        assert row["ratio"] == pytest.approx(row["ms"] / row["roofline_ms"])


def test_bench_throughput_counts_every_output_token(config_only, tmp_path):
    out = tmp_path / "throughput.json"
    result = CliRunner().invoke(main, ["bench", "throughput", "--model", str(config_only), "--load-format",
                                       "dummy", "--device", "cpu", "--num-prompts", "5", "--input-len", "8",
                                       "--output-len", "3", "--json", str(out)])
    assert result.exit_code == 0, result.output
    row = json.loads(out.read_text())["results"][0]
    assert row["output_tok_per_s"] == pytest.approx(15 / (row["ms"] / 1e3))


def test_bench_serve_streams_every_request_from_a_running_server(random_model_dir, tmp_path):
    from atomlite.server.app import make_app
    engine = LLM(str(random_model_dir), dtype="float32", device="cpu").engine
    out = tmp_path / "serve.json"
    with running(make_app(engine, "tiny")) as base:
        result = CliRunner().invoke(main, ["bench", "serve", "--base-url", base, "--model", str(random_model_dir),
                                           "--num-prompts", "6", "--input-len", "8", "--output-len", "5",
                                           "--max-concurrency", "3", "--json", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())["results"]
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 30
    assert 0 < summary["median_ttft_ms"] <= summary["p99_ttft_ms"]
    assert "Output token throughput (tok/s):" in result.output


def test_bench_serve_without_a_server_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"])
    assert result.exit_code == 2 and "no OpenAI-compatible server answered" in result.output


def test_bench_speculative_prints_its_five_rows_and_the_demo_assistants_acceptance(tmp_path):
    out = tmp_path / "speculative.json"
    spec = json.dumps({"method": "mtp", "model": str(DEMO_ASSISTANT_DIR), "num_speculative_tokens": 4})
    result = CliRunner().invoke(main, ["bench", "speculative", "--model", str(DEMO_DIR), "--device", "cpu",
                                       "--speculative-config", spec, "--input-len", "8", "--output-len", "12",
                                       "--repeats", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r["metric"]: r for r in json.loads(out.read_text())["results"]}
    names = ["no drafts", "oracle drafts, k=4", "rejected drafts, k=4", "verify step of 5 tokens", "mtp drafts, k=4"]
    assert [name for name in rows if not name.startswith(" ")] == names  # indented rows qualify the row above
    assert [line.split("  ")[0] for line in result.output.splitlines() if line.startswith(tuple(names))] == names
    base, oracle, rejected, verify, mtp = (rows[name] for name in names)
    assert oracle["identical_to_no_drafts"] and oracle["acceptance_length"] == 5  # every draft accepted
    assert rejected["acceptance_length"] == 1
    assert mtp["identical_to_no_drafts"] and mtp["acceptance_length"] > 1
    assert result.output.count("output identical to no drafts") == 2
    for row in (base, oracle, rejected, mtp):
        assert row["ratio"] == pytest.approx(row["ms_per_token"] / base["ms_per_token"])
        assert row["tok_per_s"] == pytest.approx(1e3 / row["ms_per_token"])
    assert verify["ms_per_token"] > 0 and verify["tok_per_s"] is None


def test_bench_speculative_without_a_config_is_one_line():
    result = CliRunner().invoke(main, ["bench", "speculative", "--model", str(DEMO_DIR), "--device", "cpu"])
    assert result.exit_code == 2
    assert result.output.startswith("error: bench speculative needs --speculative-config, e.g. ")
    assert result.output.count("\n") == 1


# Google's model cards: 31B has 30.7B parameters; 26B-A4B 25.2B, of which 3.8B are active per token; E2B 2.3B
# effective (its per-layer embedding tables are looked up, not read whole).
@pytest.mark.parametrize("name,active,every_expert", [("gemma-4-31B-it", 30.7e9, 30.7e9),
                                                      ("gemma-4-26B-A4B-it", 3.8e9, 25.2e9),
                                                      ("gemma-4-E2B-it", 2.3e9, 2.3e9)])
def test_decode_roofline_reads_the_published_parameter_counts(name, active, every_expert):
    """A decode step of one sequence reads the active parameters once (the tied lm_head included), in bf16; one
    of a batch large enough to touch every expert reads all of them. The published figures have two or three
    significant digits."""
    model = meta_model(EngineConfig(model=f"{EXAMPLES}/{name}", dtype="bfloat16"), Platform())
    read = lambda batch: (weight_bytes_read(model, batch) + logits_bytes(model)) / 2  # noqa: E731
    assert read(1) == pytest.approx(active, rel=0.015)
    assert read(10**6) == pytest.approx(every_expert, rel=0.015)


@pytest.mark.parametrize("name", ["gemma-4-31B-it", "gemma-4-E2B-it"])
def test_decode_roofline_kv_bytes_are_what_each_layer_reads_from_the_allocated_cache(name):
    """Per layer, the bytes of one token in the cache views the engine allocates (V alone on 31B's k_eq_v layers,
    the target's cache for E2B's KV-sharing layers), times the keys its attention sees (its window, if any)."""
    from atomlite.engine.kv.kv_cache import KVCacheManager
    model = meta_model(EngineConfig(model=f"{EXAMPLES}/{name}", dtype="bfloat16"), Platform())
    specs = model.kv_specs(torch.bfloat16)
    kv = KVCacheManager(specs, 2, 16, torch.device("meta"))
    for batch, context in ((2, 512), (1, 4096)):
        expected = 0
        for i, attn in enumerate(model.attention_layers()):
            token = sum(t[0, 0].numel() * t.element_size() for t in kv.cache_for_layer(i)[:2] if t is not None)
            expected += batch * min(context, attn.window or context) * token
        assert kv_bytes_read(specs, batch, context) == expected


def test_bench_serve_times_a_server_without_a_tokenizer_under_vllm_names(config_only, tmp_path):
    """No text comes back, only token ids (return_token_ids): TTFT and ITL still count from the chunks carrying
    them; the roofline uses the concurrency that ran."""
    from atomlite.server.app import make_app
    engine = LLM(str(config_only), load_format="dummy", device="cpu").engine
    assert engine.tokenizer is None
    out = tmp_path / "serve.json"
    with running(make_app(engine, "tiny")) as base:
        result = CliRunner().invoke(main, ["bench", "serve", "--base-url", base, "--model", str(config_only),
                                           "--num-prompts", "4", "--random-input-len", "8", "--random-output-len",
                                           "6", "--max-concurrency", "2", "--result-filename", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())["results"]
    assert summary["completed"] == 4 and summary["total_output_tokens"] == 24
    assert summary["median_ttft_ms"] > 0 and summary["mean_itl_ms"] > 0 and summary["first_ttft_ms"] > 0
    assert summary["peak_concurrency"] == 2 and 1 <= summary["mean_concurrency"] <= 2
    assert "at concurrency 2 (the mean in flight)" in result.output or "at concurrency 1 (the mean" in result.output


@pytest.fixture(scope="module")
def vision_config_only(checkpoints, tmp_path_factory):
    """A tiny vision checkpoint's config.json alone (31B's tower shape, scaled down): no weights, no tokenizer."""
    path, _ = checkpoints.get("dense", vision="standardized", max_position_embeddings=2048)
    out = tmp_path_factory.mktemp("vision-config-only")
    shutil.copy(path / "config.json", out / "config.json")
    return out


def test_bench_latency_with_images_prints_ttft_against_text_and_the_towers_rate(vision_config_only, tmp_path):
    out = tmp_path / "images.json"
    result = CliRunner().invoke(main, ["bench", "latency", "--model", str(vision_config_only), "--load-format",
                                       "dummy", "--device", "cpu", "--input-len", "8", "--output-len", "2",
                                       "--batch-size", "1", "--repeats", "2", "--images-per-prompt", "2",
                                       "--image-size", "64x48", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    text, image, tower = rows[:3]
    soft_tokens = 266  # 64x48 fitted to 280 soft tokens: 912x672 pixels, 57x42 patches
    total = 2 * (soft_tokens + 2) + 8
    assert text["metric"] == f"TTFT, text-only {total}-token prompt"
    assert image["metric"] == "TTFT, 2 image(s) + 8 text tokens"
    assert image["roofline_ms"] == pytest.approx(text["ms"])  # the baseline is the text prompt's TTFT
    assert image["ratio"] == pytest.approx(image["ms"] / text["ms"])
    assert "the tower ran 4 times, no encoder-cache hit" in result.output  # fresh images on both repeats
    assert tower["metric"] == "vision tower, 2 images of 64x48"
    assert tower["images_per_s"] == pytest.approx(2e3 / tower["ms"])
    assert tower["roofline_images_per_s"] == pytest.approx(2e3 / tower["roofline_ms"])
    assert [r["metric"] for r in rows[3:]] == ["TPOT, batch 1"]
    for line in (image["metric"], tower["metric"], "images/s (roofline"):
        assert line in result.output


def test_bench_serve_sends_chats_with_images_to_a_bench_checkpoint_and_times_health(vision_config_only, tmp_path):
    """bench_checkpoint gives the config-only folder a tokenizer and chat template, so the server takes image chats;
    every request's image reaches the tower (fresh pixels, no encoder-cache hit) and /health is timed meanwhile."""
    from atomlite.benchmarks.bench_checkpoint import write_bench_checkpoint
    from atomlite.server.app import make_app
    served = write_bench_checkpoint(vision_config_only, tmp_path / "served")
    engine = LLM(str(served), load_format="dummy", device="cpu", max_model_len=2048).engine
    out = tmp_path / "serve.json"
    with running(make_app(engine, "tiny")) as base:
        result = CliRunner().invoke(main, ["bench", "serve", "--base-url", base, "--model", str(served),
                                           "--num-prompts", "3", "--input-len", "10", "--output-len", "4",
                                           "--max-concurrency", "2", "--images-per-prompt", "1",
                                           "--image-size", "64x48", "--json", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())["results"]
    assert summary["completed"] == 3 and summary["failed"] == 0 and summary["total_output_tokens"] == 12
    assert engine.runner.images.num_encoded == 3
    assert summary["health_requests"] >= 1 and 0 < summary["p99_health_ms"] <= summary["max_health_ms"]
    assert "GET /health Latency (meanwhile)" in result.output


def test_bench_checkpoint_puts_the_configs_special_tokens_at_their_ids(tmp_path):
    from transformers import AutoTokenizer

    from atomlite.benchmarks.bench_checkpoint import write_bench_checkpoint
    served = write_bench_checkpoint(Path(EXAMPLES) / "gemma-4-31B-it-vision", tmp_path / "g31v")
    config = json.loads((served / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(served)
    for key in ("image_token_id", "video_token_id", "boi_token_id", "eoi_token_id"):
        assert tokenizer.convert_ids_to_tokens(config[key]).startswith(("<|", "<image"))
    text = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a b"}]}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == config["text_config"]["bos_token_id"] and ids.count(config["image_token_id"]) == 1
    assert max(ids) < config["text_config"]["vocab_size"]


def test_bench_latency_refuses_images_for_a_text_model_naming_the_flag(config_only):
    result = CliRunner().invoke(main, ["bench", "latency", "--model", str(config_only), "--load-format", "dummy",
                                       "--device", "cpu", "--images-per-prompt", "1", "--repeats", "1"])
    assert result.exit_code == 2 and "--images-per-prompt needs a model with a vision tower" in result.output


def test_vision_tower_flops_count_every_gemm_and_the_attention_over_an_images_patches():
    """Counted from the config, checked against the linear layers a built tower holds (31B's tower on meta)."""
    config = EngineConfig(model=f"{EXAMPLES}/gemma-4-31B-it-vision", dtype="bfloat16")
    tower = meta_model(config, Platform()).vision
    cfg, patches = config.model_spec.vision.hf, 2304  # 256 soft tokens
    projector = tower.projector.embedding_projection
    per_patch = sum(m.in_features * m.out_features for m in tower.modules()
                    if hasattr(m, "in_features") and m is not projector)
    attention = 27 * 4 * patches ** 2 * 16 * 72
    expected = 2 * patches * per_patch + attention + 2 * 256 * projector.in_features * projector.out_features
    assert vision_tower_flops(cfg, 5376, patches) == expected


def test_expected_experts_match_a_count_of_random_routings():
    """E * (1 - (1 - k/E)^T) against the distinct experts of 2000 drawn routings: each of T tokens picks k of 26B-A4B's
    128 experts at random."""
    from atomlite.benchmarks.roofline import expected_experts, routed_layers
    model = meta_model(EngineConfig(model=f"{EXAMPLES}/gemma-4-26B-A4B-it", dtype="bfloat16"), Platform())
    layer = routed_layers(model)[0]
    g = torch.Generator().manual_seed(0)
    for tokens in (1, 8, 64, 512):
        picks = torch.rand(2000, tokens, layer.num_experts, generator=g).topk(layer.top_k, dim=-1).indices
        hit = torch.zeros(2000, layer.num_experts).scatter_(1, picks.flatten(1), 1.0)
        assert expected_experts(layer, tokens) == pytest.approx(hit.sum(1).mean().item(), rel=0.01)


def test_prefill_bytes_are_the_models_parameters_with_the_experts_it_read(checkpoints):
    """Counted from the parameters by name on meta: every weight but the embedding tables once per chunk, each MoE
    layer's experts by the share it read, the tied lm_head once; and each layer's K/V rows in the cache the engine
    allocates, written once by the layers that own them and read once by every layer."""
    from atomlite.benchmarks.roofline import prefill_step_bytes, routed_layers
    from atomlite.engine.kv.kv_cache import KVCacheManager
    path, _ = checkpoints.get("moe")
    model = meta_model(EngineConfig(model=str(path), dtype="bfloat16"), Platform())
    layers = routed_layers(model)
    reads = {m: 1 + i for i, m in enumerate(layers)}  # any count the routing may give
    nbytes = lambda p: p.numel() * p.element_size()  # noqa: E731
    named = dict(model.named_parameters())
    experts = [n for n in named if ".experts." in n]
    dense = sum(nbytes(p) for n, p in named.items() if "embed" not in n and n not in experts)
    routed = sum(nbytes(named[n]) * reads[model.get_submodule(n.rsplit(".", 1)[0])] / 4  # the config's 4 experts
                 for n in experts)
    table = nbytes(named["model.embed_tokens.weight"])
    specs = model.kv_specs(torch.bfloat16)
    kv = KVCacheManager(specs, 2, 16, torch.device("meta"))
    token_kv = [sum(nbytes(t[0, 0]) for t in kv.cache_for_layer(i)[:2] if t is not None) for i in range(len(specs))]
    owned = [s.kind != "shared" for s in specs]
    for prompt_len, budget, chunks in ((40, 2048, 1), (40, 16, 3)):
        got = prefill_step_bytes(model, specs, prompt_len, budget, reads)
        assert got["weights"] == pytest.approx(chunks * dense + routed + table)
        assert got["kv"] == sum(prompt_len * b * (1 + own) for b, own in zip(token_kv, owned))


def test_ttft_counts_the_experts_the_routing_chose(checkpoints):
    """A 2-token prompt's prefill in a tiny MoE model (4 experts, 2 per token): zeroing the experts no layer was
    counted as reading leaves its logprobs as they were; zeroing one it read changes them."""
    from atomlite import SamplingParams
    from atomlite.benchmarks.roofline import RoutedExperts
    llm = LLM(str(checkpoints.get("moe")[0]), dtype="float32", device="cpu")
    params = SamplingParams(max_tokens=1, logprobs=5, temperature=0)
    prompt = random_prompt(2, seed=4)
    routed = RoutedExperts(llm.engine.model)
    with routed.counting():
        before = llm.generate([prompt], params)[0].outputs[0].logprobs
    reads = routed.reads()
    assert any(len(routed.touched(layer)) < layer.num_experts for layer in routed.layers)
    for layer in routed.layers:
        touched = routed.touched(layer)
        assert reads[layer] == len(touched) and layer.top_k <= len(touched) <= layer.num_experts
        for expert in set(range(layer.num_experts)) - touched:
            layer.gate_up_proj.data[expert].zero_()
            layer.down_proj.data[expert].zero_()
    assert llm.generate([prompt], params)[0].outputs[0].logprobs == before
    layer = routed.layers[0]
    layer.down_proj.data[min(routed.touched(layer))].zero_()
    assert llm.generate([prompt], params)[0].outputs[0].logprobs != before
