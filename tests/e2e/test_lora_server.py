"""LoRA adapters through `atomlite serve` and the real openai client, on a tiny random Gemma 4 with PEFT's adapters:
`--enable-lora --lora-modules first=PATH` (vLLM's space-separated form), /v1/models lists the adapter with its
parent, a request's model picks the adapter, concurrent requests to different adapters and the base give PEFT's
greedy tokens, adapters load and unload at runtime (VLLM_ALLOW_RUNTIME_LORA_UPDATING), an unknown name is OpenAI's
404, bad adapters are a 400 or 404 and bad flags exit 2 with one line; /metrics has the adapters' gauge."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from atomlite.accuracy.runner import SERVED_NAME, start_server, stop_server
from helpers import hf_greedy, random_prompt
from lora_adapters import build_adapters
import tiny_models

PROMPTS = [random_prompt(n, seed=60 + n) for n in (13, 7, 18)]
TOKENS = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, adapters' folder, the PEFT model with both adapters), the server serving `first` from the start."""
    out = tmp_path_factory.mktemp("lora-server")
    peft_model = build_adapters(tiny_models.build("dense", out / "model", seed=5), out, seed=21)
    flags = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "128", "--enable-lora", "--lora-modules",
             f"first={out / 'first'}", "--max-loras", "2", "--max-lora-rank", "8"]
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    try:
        proc, base = start_server(out / "model", flags, out / "server.log")
    finally:
        del os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]
    try:
        yield base, out, peft_model
    finally:
        stop_server(proc)


def client_of(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def tokens(client: openai.OpenAI, model: str, prompt: list[int]) -> list[int]:
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS, temperature=0,
                                      extra_body={"return_token_ids": True, "ignore_eos": True})
    return reply.choices[0].token_ids


def peft_tokens(peft_model, adapter: str | None, prompt: list[int]) -> list[int]:
    if adapter is None:
        with peft_model.disable_adapter():
            return hf_greedy(peft_model, prompt, TOKENS)
    peft_model.set_adapter(adapter)
    return hf_greedy(peft_model, prompt, TOKENS)


def test_models_lists_the_adapter_with_its_parent(served):
    base, out, _ = served
    cards = {card.id: card for card in client_of(base).models.list().data}
    assert set(cards) >= {SERVED_NAME, "first"}
    assert cards["first"].model_dump()["parent"] == SERVED_NAME
    assert cards["first"].model_dump()["root"] == str(out / "first")


def test_concurrent_requests_to_adapters_loaded_at_start_and_at_runtime(served):
    base, out, peft_model = served
    loaded = httpx.post(f"{base}/v1/load_lora_adapter", json={"lora_name": "second", "lora_path": str(out / "second")})
    assert loaded.status_code == 200, loaded.text
    try:
        client = client_of(base)
        jobs = [(model, prompt) for prompt in PROMPTS for model in ("first", "second", SERVED_NAME)]
        with ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(lambda job: tokens(client, *job), jobs))
        for (model, prompt), mine in zip(jobs, got):
            assert mine == peft_tokens(peft_model, None if model == SERVED_NAME else model, prompt), model
        metrics = httpx.get(f"{base}/metrics").text
        assert 'atomlite:lora_requests_info{max_lora="2"' in metrics
    finally:
        assert httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "second"}).status_code == 200
    with pytest.raises(openai.NotFoundError, match="The model `second` does not exist"):
        tokens(client_of(base), "second", PROMPTS[0])
    again = httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "second"})
    assert again.status_code == 404 and "cannot be found" in again.json()["error"]["message"]


def test_responses_name_the_adapter_they_ran_with(served):
    """As vLLM: a response's model is the adapter's name, streamed or not (chat formats through the same code;
    this model has no tokenizer); the base model's is the served name."""
    client = client_of(served[0])
    for model in ("first", SERVED_NAME):
        assert client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=2).model == model
        stream = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=2, stream=True)
        assert {chunk.model for chunk in stream} == {model}


def test_an_unknown_model_is_openais_404(served):
    with pytest.raises(openai.NotFoundError) as e:
        client_of(served[0]).chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert "The model `nope` does not exist" in e.value.body["message"]


@pytest.mark.parametrize("case,status,words", [("missing", 404, "no such folder"),
                                               ("duplicate", 400, "has already been loaded")])
def test_bad_runtime_loads_are_refused(served, tmp_path, case, status, words):
    """(A rank above --max-lora-rank is refused at startup below, as offline: test_lora_errors.)"""
    base, out, _ = served
    name, path = ("missing", tmp_path / "nowhere") if case == "missing" else ("first", out / "first")
    reply = httpx.post(f"{base}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})
    assert reply.status_code == status and words in reply.json()["error"]["message"]


def serve_exit(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atomlite.cli", "serve", *flags], capture_output=True, text=True,
                          timeout=300)


def test_bad_lora_flags_exit_2_with_one_line(served):
    _, out, _ = served
    model = ["--model", str(out / "model"), "--device", "cpu", "--port", "0"]
    cases = [
        ([*model, "--lora-modules", f"first={out / 'first'}"], "--lora-modules needs --enable-lora"),
        ([*model, "--enable-lora", "--max-lora-rank", "4", "--lora-modules", f"second={out / 'second'}"],
         "LoRA rank 8 is greater than max_lora_rank 4."),
        ([*model, "--enable-lora", "--lora-modules", "first"], "give name=path"),
        ([*model, "--enable-lora", "--lora-modules", f"gone={out / 'gone'}"], "no such folder"),
    ]
    for flags, words in cases:
        done = serve_exit(*flags)
        assert done.returncode == 2, done.stderr
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
