"""Speculative decoding through `atomlite serve --speculative-config` and the real openai client, on the demo model
with its trained assistant (mtp) and with prompt lookup (ngram): greedy completions and chats, whole and streamed,
with stop strings and logprobs, are the text, tokens and usage of the same server without drafts; /metrics counts
the drafts as vLLM does; penalties and structured outputs decode without drafts beside drafted requests; a bad
--speculative-config is one line and status 2."""
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from atomlite.accuracy.runner import SERVED_NAME, free_port, start_server, stop_server
from atomlite.demo import DEMO_ASSISTANT_DIR, DEMO_DIR
from server_utils import wait_for_idle

K = {"mtp": 4, "ngram": 3}
SPECS = {"mtp": {"method": "mtp", "model": str(DEMO_ASSISTANT_DIR), "num_speculative_tokens": K["mtp"]},
         "ngram": {"method": "ngram", "num_speculative_tokens": K["ngram"]}}
QUESTION = "Ava has 7 pens and gets 5 more. How many pens does Ava have now?"
SHOT = "Question: Tom has 3 apples and gets 4 more. How many apples does Tom have now?\nAnswer: 3 + 4 = 7\n#### 7\n\n"
PROMPTS = [f"Question: {QUESTION}\nAnswer:",
           f"{SHOT}Question: Ben has 9 cards and gets 6 more. How many cards does Ben have now?\nAnswer:",
           "Question: 2+3=?"]
CHAT = [{"role": "user", "content": QUESTION}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100}},
          "required": ["answer"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """`atomlite serve` of the demo model without drafts and with each drafter, started side by side."""
    logs = tmp_path_factory.mktemp("spec-servers")
    flags = ["--device", "cpu", "--max-model-len", "1024"]
    configs = {"none": flags, **{name: [*flags, "--speculative-config", json.dumps(spec)]
                                 for name, spec in SPECS.items()}}
    with ThreadPoolExecutor(len(configs)) as pool:
        futures = {name: pool.submit(start_server, DEMO_DIR, args, logs / f"{name}.log")
                   for name, args in configs.items()}
    started = {name: f.result() for name, f in futures.items() if f.exception() is None}
    try:
        for future in futures.values():
            future.result()  # the first server that did not start, with its log
        yield {name: base for name, (_, base) in started.items()}
    finally:
        with ThreadPoolExecutor(len(configs)) as pool:
            list(pool.map(stop_server, [proc for proc, _ in started.values()]))


def client_of(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(params=list(SPECS))
def drafter(request) -> str:
    return request.param


@pytest.fixture
def clients(servers, drafter) -> tuple[openai.OpenAI, openai.OpenAI]:
    """(the server without drafts, the server with this drafter)."""
    return client_of(servers["none"]), client_of(servers[drafter])


def complete(client: openai.OpenAI, **kw) -> tuple[list[tuple], dict]:
    """(text, finish_reason, token ids) per choice of a greedy completion, and its usage."""
    reply = client.completions.create(model=SERVED_NAME, temperature=0, extra_body={"return_token_ids": True}, **kw)
    choices = sorted(reply.choices, key=lambda c: c.index)
    return [(c.text, c.finish_reason, c.token_ids) for c in choices], reply.usage.model_dump()


def complete_streamed(client: openai.OpenAI, **kw) -> tuple:
    """(text, finish_reason, token ids) of a streamed greedy completion from its chunks, its usage, and its deltas."""
    chunks = list(client.completions.create(model=SERVED_NAME, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True}, **kw))
    deltas = [c.choices[0] for c in chunks if c.choices]
    tokens = [t for d in deltas for t in (d.token_ids or [])]
    text = "".join(d.text for d in deltas)
    return (text, deltas[-1].finish_reason, tokens), chunks[-1].usage.model_dump(), [d.text for d in deltas]


def chat(client: openai.OpenAI, stream: bool = False, **kw) -> tuple:
    """(content, finish_reason) of a greedy chat, whole or from its stream's chunks, and its usage."""
    args = dict(model=SERVED_NAME, messages=CHAT, temperature=0, **kw)
    if not stream:
        reply = client.chat.completions.create(**args)
        return (reply.choices[0].message.content, reply.choices[0].finish_reason), reply.usage.model_dump()
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    deltas = [c.choices[0] for c in chunks if c.choices]
    return ("".join(d.delta.content or "" for d in deltas), deltas[-1].finish_reason), chunks[-1].usage.model_dump()


def spec_counters(base: str) -> dict:
    """The spec_decode_* counters of /metrics once the server is idle."""
    values = {"per_pos": {}}
    for family in text_string_to_metric_families(wait_for_idle(base)):
        for sample in family.samples:
            name = sample.name.removeprefix("atomlite:spec_decode_num_")
            if name == "accepted_tokens_per_pos_total":
                values["per_pos"][int(sample.labels["position"])] = sample.value
            elif name in ("drafts_total", "draft_tokens_total", "accepted_tokens_total"):
                values[name.removesuffix("_total")] = sample.value
    return values


def grown(before: dict, after: dict) -> dict:
    return {"drafts": after["drafts"] - before["drafts"], "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
            "accepted": after["accepted_tokens"] - before["accepted_tokens"],
            "per_pos": {p: v - before["per_pos"].get(p, 0) for p, v in after["per_pos"].items()}}


def test_greedy_completions_are_the_completions_without_drafts(clients):
    plain, spec = clients
    want = complete(plain, prompt=PROMPTS, max_tokens=40)
    assert complete(spec, prompt=PROMPTS, max_tokens=40) == want
    for prompt in PROMPTS:
        one = complete(plain, prompt=prompt, max_tokens=40)
        streamed, usage, _ = complete_streamed(spec, prompt=prompt, max_tokens=40)
        assert ([streamed], usage) == one


def test_stop_string_inside_accepted_drafts_ends_where_it_does_without_drafts(clients, servers, drafter):
    plain, spec = clients
    [(text, _, _)], _ = complete(plain, prompt=PROMPTS[1], max_tokens=40)
    _, _, deltas = complete_streamed(spec, prompt=PROMPTS[1], max_tokens=40)
    # the stop string: two characters strictly inside the first delta of several tokens (one verify step's run)
    start = next(sum(map(len, deltas[:i])) for i, d in enumerate(deltas) if i > 0 and len(d) >= 4)
    stop = text[start + 1:start + 3]
    assert text.find(stop) == start + 1, (text, stop)
    before = spec_counters(servers[drafter])
    for stops in ([stop], [stop, "no such text"]):
        want = complete(plain, prompt=PROMPTS[1], max_tokens=40, stop=stops)
        assert want[0][0][:2] == (text[:start + 1], "stop")
        assert complete(spec, prompt=PROMPTS[1], max_tokens=40, stop=stops) == want
        streamed, usage, _ = complete_streamed(spec, prompt=PROMPTS[1], max_tokens=40, stop=stops)
        assert ([streamed], usage) == want
    assert grown(before, spec_counters(servers[drafter]))["accepted"] > 0


def test_logprobs_are_the_logprobs_without_drafts(clients):
    plain, spec = clients
    args = dict(model=SERVED_NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0, logprobs=3)
    want = plain.completions.create(**args).choices[0].logprobs
    got = spec.completions.create(**args).choices[0].logprobs
    assert got.tokens == want.tokens and got.text_offset == want.text_offset
    assert got.token_logprobs == pytest.approx(want.token_logprobs, abs=1e-4)
    for g, w in zip(got.top_logprobs, want.top_logprobs):
        assert g.keys() == w.keys() and list(g.values()) == pytest.approx(list(w.values()), abs=1e-4)
    args = dict(model=SERVED_NAME, messages=CHAT, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2)
    want = plain.chat.completions.create(**args).choices[0].logprobs.content
    got = spec.chat.completions.create(**args).choices[0].logprobs.content
    assert [c.token for c in got] == [c.token for c in want]
    assert [c.logprob for c in got] == pytest.approx([c.logprob for c in want], abs=1e-4)
    assert [[t.token for t in c.top_logprobs] for c in got] == [[t.token for t in c.top_logprobs] for c in want]


def test_greedy_chat_is_the_chat_without_drafts(clients):
    plain, spec = clients
    want = chat(plain, max_tokens=40)
    assert chat(spec, max_tokens=40) == want
    assert chat(spec, stream=True, max_tokens=40) == want
    stop = want[0][0][10:12]  # past the first verify step's run
    assert want[0][0].find(stop) == 10
    want = chat(plain, max_tokens=40, stop=[stop])
    assert want[0][1] == "stop"
    assert chat(spec, max_tokens=40, stop=[stop]) == want
    assert chat(spec, stream=True, max_tokens=40, stop=[stop]) == want


def test_metrics_count_drafts_and_accepted_tokens_by_position(clients, servers, drafter):
    _, spec = clients
    before = spec_counters(servers[drafter])
    complete(spec, prompt=PROMPTS, max_tokens=40)
    chat(spec, stream=True, max_tokens=40)
    after = spec_counters(servers[drafter])
    k = K[drafter]
    assert sorted(after["per_pos"]) == list(range(k))
    step = grown(before, after)
    assert step["drafts"] > 0 and 0 < step["accepted"] <= step["draft_tokens"] <= k * step["drafts"]
    per_pos = [step["per_pos"][p] for p in range(k)]
    assert sum(per_pos) == step["accepted"]
    assert per_pos == sorted(per_pos, reverse=True)  # a draft token counts only after those before it
    if drafter == "mtp":  # the assistant always proposes k, and accepts most on the demo's arithmetic
        assert step["draft_tokens"] == k * step["drafts"]
        assert step["accepted"] / step["drafts"] > 2


def test_penalties_and_json_schema_decode_without_drafts_beside_drafted_requests(clients, servers, drafter):
    plain, spec = clients
    requests = {
        "penalty": lambda c: complete(c, prompt=PROMPTS[0], max_tokens=30, frequency_penalty=1.0),
        "json": lambda c: chat(c, max_tokens=40, response_format=JSON_SCHEMA),
        "greedy": lambda c: complete(c, prompt=PROMPTS[1], max_tokens=40),
    }
    want = {name: ask(plain) for name, ask in requests.items()}
    assert want["json"][0][1] == "stop" and set(json.loads(want["json"][0][0])) == {"answer"}
    for name in ("penalty", "json"):
        before = spec_counters(servers[drafter])
        assert requests[name](spec) == want[name]
        assert grown(before, spec_counters(servers[drafter]))["drafts"] == 0, name
    before = spec_counters(servers[drafter])
    with ThreadPoolExecutor(len(requests) * 2) as pool:
        got = [(name, pool.submit(ask, spec)) for _ in range(2) for name, ask in requests.items()]
        for name, future in got:
            assert future.result() == want[name], name
    assert grown(before, spec_counters(servers[drafter]))["accepted"] > 0


BAD_CONFIGS = [("{bad json", "is not valid JSON", ("serve", "generate")),
               ('{"method": "ngram"}', "num_speculative_tokens must be", ("serve", "generate")),
               # found by serve's engine core process, where the assistant loads
               ('{"method": "mtp", "model": "/nowhere/assistant", "num_speculative_tokens": 4}', "does not exist",
                ("serve",))]


def test_bad_speculative_config_is_one_line_and_status_2():
    """All at once (each is a process of its own): serve on a free port, generate one prompt."""
    runs = [(config, problem, ["serve", "--port", str(free_port())] if command == "serve" else ["generate", "hi"])
            for config, problem, commands in BAD_CONFIGS for command in commands]
    procs = [subprocess.Popen([sys.executable, "-m", "atomlite.cli", *command, "--device", "cpu",
                               "--speculative-config", config], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for config, _, command in runs]
    for (config, problem, command), proc in zip(runs, procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (command, config, out, err)
        assert err.startswith("error: ") and err.count("\n") == 1 and problem in err, (command, config, err)
        assert "Traceback" not in out + err and "serving" not in out, (command, config, out)
