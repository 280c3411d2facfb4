"""Structured outputs (xgrammar): the device mask against xgrammar's own, greedy and sampled rows kept inside the
grammar, the offline API, the engine's run-ahead and raw logprobs, and the real server through the openai client
(response_format json_schema / json_object, vLLM's structured_outputs, streaming, mixed batches, 400s)."""
import json
import pickle
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
import torch
import xgrammar as xgr

from atomlite import LLM, SamplingParams, StructuredOutputsParams
from atomlite.demo import demo_model_dir
from atomlite.engine.sampling.sampler import sample_ids
from atomlite.engine.sampling.token_mask import apply_token_bitmask, unpack_bitmask
from atomlite.server.app import make_app
from server_utils import metric, running

NAME = "demo"
EOS = 1
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 10},
    "color": {"enum": ["red", "green", "blue"]},
    "count": {"type": "integer", "minimum": 0, "maximum": 100},
    "ok": {"type": "boolean"}}, "required": ["name", "color", "count", "ok"], "additionalProperties": False}
CHOICES = ["yes", "no", "maybe later"]
REGEX = r"[A-Z][a-z]{1,6} (is|was) [0-9]{1,3}"
QUESTIONS = [f"Question: Ava has {i} pens and gets {i % 7 + 2} more. How many pens does Ava have now?"
             for i in range(20)]


def random_bitmask(rows: int, vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31, (rows, (vocab + 31) // 32), dtype=torch.int64,
                         generator=generator).to(torch.int32)


# -- the mask ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [128, 100, 37])
def test_the_device_mask_equals_xgrammars_own_application(vocab):
    torch.manual_seed(vocab)
    logits = torch.randn(6, vocab)
    bitmask = random_bitmask(6, vocab, seed=vocab)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask, vocab_size=vocab, backend="cpu")
    before = logits.clone()
    assert torch.equal(apply_token_bitmask(logits, bitmask), want)
    assert torch.equal(logits, before)  # a copy: the logprobs reported stay the model's


def test_unpacking_reads_bit_j_of_word_w_as_token_32w_plus_j():
    bitmask = random_bitmask(3, 70, seed=1)
    allowed = unpack_bitmask(bitmask, 70)
    for row in range(3):
        for token in range(70):
            word = int(bitmask[row, token // 32]) & 0xFFFFFFFF
            assert bool(allowed[row, token]) == bool(word >> (token % 32) & 1)


def only(tokens: list[int], rows: int, vocab: int) -> torch.Tensor:
    allowed = torch.zeros(rows, (vocab + 31) // 32 * 32, dtype=torch.bool)
    allowed[:, tokens] = True
    weights = torch.tensor([1 << j for j in range(32)], dtype=torch.int64)
    words = (allowed.view(rows, -1, 32).long() * weights).sum(-1)
    return words.to(torch.int32)  # wraps bit 31 into the sign, as xgrammar stores it


def test_the_mask_applies_to_greedy_and_sampled_rows():
    vocab, kept = 64, [5, 17, 40]
    torch.manual_seed(0)
    logits = torch.randn(4, vocab) * 3
    logits[:, 9] = 50.0  # the model's favourite is outside the grammar
    bitmask = only(kept, 4, vocab)
    bitmask[3] = -1  # an unconstrained row
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams(temperature=1.5, top_k=2),
              SamplingParams(temperature=0)]
    for seed in range(30):
        generators = [None, torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 99), None]
        ids = sample_ids(logits, params, generators, torch.Generator().manual_seed(seed), bitmask=bitmask).tolist()
        assert ids[0] == max(kept, key=lambda t: logits[0, t])
        assert ids[1] in kept and ids[2] in kept
        assert ids[3] == 9


# -- the spec ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,needle", [
    ({}, "exactly one of json, regex, choice, grammar, json_object"),
    ({"regex": "a", "choice": ["a"]}, "regex and choice"),
    ({"json": "{not json"}, "structured_outputs.json"), ({"json": [1]}, "structured_outputs.json"),
    ({"choice": []}, "structured_outputs.choice"), ({"choice": ["a", 3]}, "structured_outputs.choice"),
    ({"regex": ""}, "structured_outputs.regex"), ({"grammar": 5}, "structured_outputs.grammar"),
    ({"json_object": "yes"}, "structured_outputs.json_object")])
def test_a_bad_spec_is_a_value_error_naming_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        StructuredOutputsParams(**kwargs)


def test_sampling_params_cross_the_process_boundary_with_their_spec():
    """The engine core gets SamplingParams pickled (core.py)."""
    params = SamplingParams(temperature=0, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    assert pickle.loads(pickle.dumps(params, protocol=5)) == params


# -- the engine --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo() -> LLM:
    return LLM(str(demo_model_dir()), dtype="float32", device="cpu", max_model_len=256)


def chat_prompt(llm: LLM, question: str) -> list[int]:
    text = llm.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
    return llm.tokenizer.encode(text, add_special_tokens=False)


def constrained(max_tokens: int = 80, temperature: float = 0.0, **spec) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=7,
                          structured_outputs=StructuredOutputsParams(**spec))


def test_offline_generate_keeps_to_the_choices(demo):
    prompts = [chat_prompt(demo, q) for q in QUESTIONS[:6]]
    params = [constrained(choice=CHOICES, temperature=t) for t in (0.0, 1.0, 1.5)] * 2
    for out in demo.generate(prompts, params):
        assert out.outputs[0].text in CHOICES and out.outputs[0].finish_reason == "stop"


def test_grammars_are_compiled_once_per_spec(demo):
    structured = demo.engine.structured
    first = structured.compile(StructuredOutputsParams(json=SCHEMA))
    assert structured.compile(StructuredOutputsParams(json=json.dumps(SCHEMA))) is first
    assert structured.compile(StructuredOutputsParams(choice=CHOICES)) is not first


@pytest.mark.parametrize("spec,field", [({"regex": "a(b"}, "structured_outputs.regex"),
                                        ({"grammar": "root ::= undefined_rule"}, "structured_outputs.grammar"),
                                        ({"json": {"type": "nonsense"}}, "structured_outputs.json")])
def test_a_grammar_that_does_not_compile_fails_offline_and_as_the_engines_update(demo, spec, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        demo.generate("Hi", constrained(**spec))
    demo.engine.add_request("bad", "Hi", constrained(**spec))  # compiled off the step loop: the error comes after
    updates = []
    while demo.engine.has_unfinished():
        updates += demo.engine.step()
    assert [(u.request_id, u.invalid, field in u.error) for u in updates] == [("bad", True, True)]
    assert "bad" not in demo.engine.requests


def test_a_mixed_batch_leaves_unconstrained_rows_as_they_run_alone(demo):
    prompts = [chat_prompt(demo, q) for q in QUESTIONS[:6]]
    plain = SamplingParams(temperature=0, max_tokens=24)
    params = [plain, constrained(json=SCHEMA), plain, constrained(regex=REGEX), plain, constrained(choice=CHOICES)]
    mixed = demo.generate(prompts, params)
    for i in (0, 2, 4):
        alone = demo.generate([prompts[i]], plain)[0].outputs[0]
        assert (mixed[i].outputs[0].token_ids, mixed[i].outputs[0].finish_reason) == (alone.token_ids,
                                                                                      alone.finish_reason)
    jsonschema.validate(json.loads(mixed[1].outputs[0].text), SCHEMA)
    assert re.fullmatch(REGEX, mixed[3].outputs[0].text) and mixed[5].outputs[0].text in CHOICES


def test_reported_logprobs_stay_the_models_own(demo):
    prompt = chat_prompt(demo, QUESTIONS[0])
    raw = demo.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0].outputs[0]
    params = constrained(choice=["~~"], max_tokens=3)
    params.logprobs = 5
    out = demo.generate([prompt], params)[0].outputs[0]
    tilde = demo.tokenizer.convert_tokens_to_ids("~")
    assert out.text == "~~" and out.token_ids[0] == tilde
    assert set(raw.logprobs[0]) <= set(out.logprobs[0])
    assert out.logprobs[0] == {**raw.logprobs[0], tilde: pytest.approx(out.logprobs[0][tilde])}
    assert out.logprobs[0][tilde] < max(raw.logprobs[0].values())  # the grammar's token, at the model's logprob


def _graph_ready_demo(overlap: bool) -> LLM:
    llm = LLM(str(demo_model_dir()), dtype="float32", device="cpu", max_model_len=256, overlap_decode=overlap)
    llm.engine.runner.use_decode_graphs(8, llm.engine.config.max_model_len, capture=False)  # steps may run ahead
    return llm


def test_constrained_batches_run_the_forward_ahead_and_give_what_stepping_in_order_gives():
    """The next step's mask needs this step's token on the host: a constrained batch runs the next forward ahead
    but samples it only once the token is in, and gives exactly the tokens of a run without overlap."""
    overlapped, in_order = _graph_ready_demo(True), _graph_ready_demo(False)
    runner = overlapped.engine.runner
    ahead, execute_ahead = [], runner.execute_ahead
    runner.execute_ahead = lambda seqs, ids: (ahead.append(len(seqs)), execute_ahead(seqs, ids))[1]
    prompts = [chat_prompt(overlapped, q) for q in QUESTIONS[:4]]
    sampled = SamplingParams(temperature=1.0, seed=7, max_tokens=80,
                             structured_outputs=StructuredOutputsParams(regex=REGEX))
    params = [constrained(json=SCHEMA), sampled, constrained(choice=CHOICES), SamplingParams(temperature=0,
                                                                                              max_tokens=12)]
    outs = overlapped.generate(prompts, params)
    assert ahead
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids
                                                      for o in in_order.generate(prompts, params)]


# -- the server --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    llm = LLM(str(demo_model_dir()), dtype="float32", device="cpu", max_model_len=256)
    with running(make_app(llm.engine, NAME)) as base:
        yield base


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, question: str, **kw):
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": question}],
                                          max_tokens=80, **kw)


def test_json_schema_responses_always_validate(client):
    response_format = {"type": "json_schema", "json_schema": {"name": "pens", "schema": SCHEMA, "strict": True}}
    with ThreadPoolExecutor(8) as pool:  # several at once: constrained rows share batches
        answers = list(pool.map(lambda i: ask(client, QUESTIONS[i], temperature=1.0, seed=i,
                                              response_format=response_format), range(20)))
    for answer in answers:
        choice = answer.choices[0]
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert choice.finish_reason == "stop"


def test_json_object_responses_parse(client):
    answer = ask(client, QUESTIONS[1], temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
    assert answer.choices[0].finish_reason == "stop"


def test_structured_outputs_choice_and_regex(client):
    for question in QUESTIONS[:4]:
        chosen = client.completions.create(model=NAME, prompt=question, max_tokens=20, temperature=1.0, n=3,
                                           extra_body={"structured_outputs": {"choice": CHOICES}})
        assert all(c.text in CHOICES and c.finish_reason == "stop" for c in chosen.choices)
        matched = client.completions.create(model=NAME, prompt=question, max_tokens=20, temperature=1.0, n=3,
                                            extra_body={"structured_outputs": {"regex": REGEX}})
        assert all(re.fullmatch(REGEX, c.text) for c in matched.choices)


def test_the_server_batches_constrained_and_unconstrained_requests(client):
    def plain(i):
        return client.completions.create(model=NAME, prompt=QUESTIONS[i], max_tokens=24, temperature=0)

    alone = [plain(i).choices[0].text for i in range(4)]

    def either(i):
        if i % 2:
            return plain(i // 2)
        return client.completions.create(model=NAME, prompt=QUESTIONS[i], max_tokens=80, temperature=0,
                                         extra_body={"structured_outputs": {"json": SCHEMA}})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(either, range(8)))
    assert [answers[2 * i + 1].choices[0].text for i in range(4)] == alone
    for answer in answers[::2]:
        jsonschema.validate(json.loads(answer.choices[0].text), SCHEMA)


def test_a_constrained_request_streams(client):
    response_format = {"type": "json_schema", "json_schema": {"name": "pens", "schema": SCHEMA}}
    stream = ask(client, QUESTIONS[3], temperature=0, response_format=response_format, stream=True)
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    jsonschema.validate(json.loads(text), SCHEMA)
    assert len(chunks) > 3 and chunks[-1].choices[0].finish_reason == "stop"


SO = "structured_outputs"
BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({SO: {"regex": "a(b"}}, f"{SO}.regex"),
    ({SO: {"grammar": "root ::= undefined_rule"}}, f"{SO}.grammar"),
    ({SO: {"grammar": "start: \"a\""}}, f"{SO}.grammar"),
    ({SO: {"json": "{not json"}}, f"{SO}.json"),
    ({SO: {"json": {"type": "object", "properties": {"a": {"type": 5}}}}}, f"{SO}.json"),
    ({SO: {"regex": "a", "choice": ["a"]}}, "regex and choice"),
    ({SO: {}}, "exactly one"),
    ({SO: {"structural_tag": "{}"}}, "structural_tag"),
    ({SO: {"choice": ["a"]}, "response_format": {"type": "json_object"}}, "not both"),
]


@pytest.mark.parametrize("body,needle", BAD, ids=[f"bad-{i}" for i in range(len(BAD))])
def test_a_bad_constraint_is_a_400_naming_the_field_before_anything_is_queued(server, body, needle):
    before = metric(httpx.get(f"{server}/metrics").text, "atomlite:prompt_tokens_total")
    for route, request in (("completions", {"prompt": "Hi"}),
                           ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        resp = httpx.post(f"{server}/v1/{route}", json={**request, "max_tokens": 8, **body}, timeout=10)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert needle in error["message"] + str(error["param"]), error
    assert metric(httpx.get(f"{server}/metrics").text, "atomlite:prompt_tokens_total") == before
