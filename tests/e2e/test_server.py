"""The server driven by the real openai client over real HTTP: same tokens as offline, nothing lost."""
import asyncio

import httpx
import openai
import pytest

from atomlite import LLM, SamplingParams
from atomlite.server.app import make_app
from server_utils import metric, running, wait_for_idle

NAME = "tiny"
PROMPTS = ["Hello there", "Question: 12+7=?", "The sky is", "a", "Once upon a time, in a land far away,"]


@pytest.fixture(scope="module")
def model_dir(random_model_dir):
    return random_model_dir


@pytest.fixture(scope="module")
def offline(model_dir):
    return LLM(str(model_dir), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def server(model_dir):
    engine_llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=256)
    with running(make_app(engine_llm.engine, NAME)) as base:
        yield base


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def expected(offline, prompt, max_tokens=12, **kw):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **kw)
    return offline.generate([prompt], params)[0].outputs[0]


def test_completions_text_tokens_and_batch_match_offline(client, offline):
    want = [expected(offline, p) for p in PROMPTS]
    batch = client.completions.create(model=NAME, prompt=PROMPTS, max_tokens=12, temperature=0)
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == [w.text for w in want]
    one = client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=12, temperature=0)
    assert one.choices[0].text == want[1].text and one.choices[0].finish_reason == want[1].finish_reason
    ids = offline.tokenizer.encode(PROMPTS[2])
    by_ids = client.completions.create(model=NAME, prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == want[2].text
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.usage.completion_tokens == len(want[2].token_ids)


def test_streamed_completion_equals_whole(client, offline):
    want = expected(offline, PROMPTS[4], max_tokens=20)
    chunks = list(client.completions.create(model=NAME, prompt=PROMPTS[4], max_tokens=20, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason


def test_chat_and_streamed_chat_match_offline(client, offline):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    rendered = offline.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = expected(offline, offline.tokenizer.encode(rendered, add_special_tokens=False), max_tokens=16)
    reply = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, temperature=0)
    assert reply.choices[0].message.content == want.text
    assert reply.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason


def test_chat_logprobs_are_the_offline_logprobs(client, offline, model_dir):
    messages = [{"role": "user", "content": "2+2"}]
    rendered = offline.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = expected(offline, offline.tokenizer.encode(rendered, add_special_tokens=False), max_tokens=6,
                    logprobs=3)
    reply = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0,
                                           logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([lp[t] for t, lp in zip(want.token_ids, want.logprobs)],
                                                         abs=1e-5)
    assert all(len(c.top_logprobs) == 3 for c in content)


def test_echo_logprobs_equal_offline_prompt_logprobs(client, offline):
    """The lm-eval loglikelihood request: echo + logprobs + max_tokens=1."""
    prompt = "Question: 3+4=? Answer: 7"
    out = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1, logprobs=1))[0]
    resp = httpx.post(f"{client.base_url}completions", json={
        "model": NAME, "prompt": prompt, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0,
        "seed": 1234}).json()
    lp = resp["choices"][0]["logprobs"]
    n = len(out.prompt_token_ids)
    assert len(lp["token_logprobs"]) == n + 1
    assert lp["token_logprobs"][0] is None
    want = [entry[t] for t, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:])]
    assert lp["token_logprobs"][1:n] == pytest.approx(want, abs=1e-5)
    assert resp["choices"][0]["text"].startswith(prompt)
    assert "".join(lp["tokens"]) == resp["choices"][0]["text"]


def test_models_health_and_tokenizer_endpoints(server, offline):
    assert httpx.get(f"{server}/v1/models").json()["data"][0]["id"] == NAME
    assert httpx.get(f"{server}/health").status_code == 200
    info = httpx.get(f"{server}/tokenizer_info").json()
    assert info["eos_token"] == offline.tokenizer.eos_token and info["chat_template"]
    tokens = httpx.post(f"{server}/tokenize", json={"prompt": "abc <eos>", "add_special_tokens": False}).json()
    assert tokens["tokens"] == offline.tokenizer.encode("abc <eos>", add_special_tokens=False)
    assert httpx.post(f"{server}/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"] == "abc <eos>"


def test_500_requests_at_concurrency_64_lose_nothing(server, offline):
    prompts = [f"Request {i}: count" for i in range(500)]
    lengths = [4 + i % 9 for i in range(500)]
    want = offline.generate(prompts, [SamplingParams(temperature=0, max_tokens=n) for n in lengths])

    async def main():
        limit = asyncio.Semaphore(64)
        async with httpx.AsyncClient(base_url=server, timeout=120, limits=httpx.Limits(max_connections=64)) as c:
            async def one(i):
                async with limit:
                    return await c.post("/v1/completions", json={"model": NAME, "prompt": prompts[i],
                                                                 "max_tokens": lengths[i], "temperature": 0})
            return await asyncio.gather(*(one(i) for i in range(500)))

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 500
    texts = [r.json()["choices"][0]["text"] for r in responses]
    assert texts == [w.outputs[0].text for w in want]
    finals = [r.json()["choices"][0]["finish_reason"] for r in responses]
    assert finals == [w.outputs[0].finish_reason for w in want]
    text = wait_for_idle(server)
    assert metric(text, "atomlite:num_requests_running") == 0
    assert all(float(l.rsplit(" ", 1)[1]) == 0 for l in text.splitlines() if l.startswith("atomlite:kv_blocks_used"))
    assert metric(text, 'atomlite:request_finished_total{reason="length"}') + \
        metric(text, 'atomlite:request_finished_total{reason="stop"}') >= 500


def test_streaming_clients_that_hang_up_free_their_blocks(server, offline):
    async def hang_up(c, i):
        async with c.stream("POST", "/v1/completions", json={
                "model": NAME, "prompt": f"Client {i} says", "max_tokens": 200, "temperature": 0,
                "ignore_eos": True, "stream": True}) as resp:
            assert resp.status_code == 200
            seen = 0
            async for line in resp.aiter_lines():
                seen += line.startswith("data:")
                if seen >= 3:
                    return  # closing the response mid-stream drops the connection

    async def main():
        async with httpx.AsyncClient(base_url=server, timeout=60) as c:
            await asyncio.gather(*(hang_up(c, i) for i in range(20)))

    aborted = 'atomlite:request_finished_total{reason="abort"}'
    before = httpx.get(f"{server}/metrics").text
    before = metric(before, aborted) if aborted in before else 0
    asyncio.run(main())
    text = wait_for_idle(server)
    assert metric(text, aborted) - before == 20
    assert metric(text, "atomlite:num_requests_running") == 0
    assert all(float(l.rsplit(" ", 1)[1]) == 0 for l in text.splitlines() if l.startswith("atomlite:kv_blocks_used"))
    after = httpx.post(f"{server}/v1/completions", json={"model": NAME, "prompt": PROMPTS[0], "max_tokens": 12,
                                                         "temperature": 0}).json()
    assert after["choices"][0]["text"] == expected(offline, PROMPTS[0]).text
