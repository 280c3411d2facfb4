"""Runs real vLLM (CPU) on tiny checkpoints in a process of its own and prints greedy tokens as JSON.

Each vLLM process loads general plugins once, with the ATOMLITE_VLLM_* switches of its environment, so a test
that compares configurations runs one process per switch setting and several LLM instances inside it.

usage: python tests/e2e/vllm_cases.py '{"prompts": [[ids]], "max_tokens": N, "runs": [{"name", "model", "llm": {}}]}'
A run may also ask its workers for WORKER_QUERIES ("workers": [names]), or expect to be refused at startup
("refused": true; its result is the error).
"""
import gc
import json
import os
import sys

VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_CI_ENV": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "TOKENIZERS_PARALLELISM": "false"}
BASE_LLM_ARGS = {"dtype": "float32", "max_model_len": 256, "gpu_memory_utilization": 0.3, "enforce_eager": True,
                 "skip_tokenizer_init": True, "seed": 0}


def atomlite_calls() -> int:
    from atomlite.plugin.vllm import registered
    if not registered():
        return 0
    from atomlite.plugin.vllm.backend import AtomliteAttentionImpl
    return AtomliteAttentionImpl.calls


def parameter_bytes(worker) -> dict[str, int]:
    """Every parameter's bytes in the model that worker holds."""
    return {n: p.numel() * p.element_size() for n, p in worker.model_runner.get_model().named_parameters()}


def worker_atomlite_calls(worker) -> int:
    """The attention forwards atomlite's backend ran in worker's process."""
    return atomlite_calls()


# What a run's "workers" may ask of each of vLLM's workers (LLM.collective_rpc; the answers come in rank order).
# With vLLM's engine core in a process of its own, these reach it pickled: VLLM_ALLOW_INSECURE_SERIALIZATION=1.
WORKER_QUERIES = {"parameter_bytes": parameter_bytes, "atomlite_calls": worker_atomlite_calls}


def refusal(spec: dict) -> str | None:
    """The error an LLM with spec's arguments is refused with at startup; None if it starts."""
    from vllm import LLM
    try:
        llm = LLM(model=spec["model"], **{**BASE_LLM_ARGS, **spec.get("llm", {})})
    except Exception as e:  # noqa: BLE001 - what is refused, and how, is the result
        return f"{type(e).__name__}: {e}"
    del llm
    return None


def run(case: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=case["max_tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in case["prompts"]]
    results = {}
    for spec in case["runs"]:
        if spec.get("refused"):
            results[spec["name"]] = {"error": refusal(spec)}
            continue
        llm = LLM(model=spec["model"], **{**BASE_LLM_ARGS, **spec.get("llm", {})})
        before = atomlite_calls()
        tokens, cached = [], []
        for _ in range(spec.get("repeat", 1)):  # a repeat can read the prompts back from the prefix cache
            outputs = llm.generate(prompts, params, use_tqdm=False)
            tokens.append([list(o.outputs[0].token_ids) for o in outputs])
            cached.append([o.num_cached_tokens or 0 for o in outputs])
        results[spec["name"]] = {"tokens": tokens, "cached": cached, "atomlite_calls": atomlite_calls() - before}
        for query in spec.get("workers", ()):
            results[spec["name"]][f"workers_{query}"] = llm.collective_rpc(WORKER_QUERIES[query])
        del llm
        gc.collect()
    return results


if __name__ == "__main__":
    for key, value in VLLM_ENV.items():
        os.environ.setdefault(key, value)
    print("RESULT " + json.dumps(run(json.loads(sys.argv[1]))), flush=True)
