"""Logits controls (vLLM's SamplingParams fields): each one against its definition written out in torch, in the
sampler and end to end on the demo model, under the engine's run-ahead decode too (where a sequence's newest token
is still on the device when the next step samples), and through the server."""
import httpx
import openai
import pytest
import torch

from atomlite import LLM, SamplingParams
from atomlite.demo import demo_model_dir
from atomlite.engine import llm_engine
from atomlite.engine.sampling.logits_controls import TokenHistory, apply_logits_controls
from atomlite.engine.sampling.sampler import filtered_probs, sample_ids
from atomlite.engine.sequence import Sequence
from atomlite.server.app import make_app
from atomlite.tokenizer import load_tokenizer
from server_utils import running

VOCAB = 24
EOS = 1
PROMPT = "1 2 3 4"  # a prompt whose greedy continuation the penalties change
NAME = "demo"


def seq_with(prompt: list[int], output: list[int], params: SamplingParams) -> Sequence:
    seq = Sequence(list(prompt), params)
    seq.token_ids += output
    return seq


def controlled(logits: torch.Tensor, params: list[SamplingParams], seqs: list[Sequence], **history) -> torch.Tensor:
    return apply_logits_controls(logits, params, TokenHistory(seqs, **history))


def greedy_ids(logits, params, seqs, **history) -> list[int]:
    return sample_ids(logits, params, [None] * len(params), torch.Generator(), TokenHistory(seqs, **history)).tolist()


# -- references written out from the definitions ---------------------------------------------------------------
def penalized_reference(logits: torch.Tensor, prompt: list[int], output: list[int], repetition: float = 1.0,
                        frequency: float = 0.0, presence: float = 0.0) -> torch.Tensor:
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=logits.shape[-1]).float()
    seen = counts > 0
    seen[prompt] = True
    out = logits.clone()
    for token in seen.nonzero()[:, 0].tolist():
        out[token] = out[token] / repetition if out[token] > 0 else out[token] * repetition
    return out - frequency * counts - presence * (counts > 0).float()


def min_p_reference(logits: torch.Tensor, temperature: float, min_p: float) -> torch.Tensor:
    probs = torch.softmax(logits / temperature, dim=-1)
    kept = torch.where(probs >= min_p * probs.max(), probs, 0.0)
    return kept / kept.sum()


# -- the sampler -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("repetition,frequency,presence", [(1.0, 0.7, 0.0), (1.0, 0.0, 1.5), (1.8, 0.0, 0.0),
                                                           (0.6, -0.5, 0.9), (2.5, 2.0, -2.0)])
def test_penalties_match_their_definition(repetition, frequency, presence):
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 3
    prompt, outputs = [3, 4, 5, 3], [[], [6, 6, 7, 3], [8, 9, 9, 9, 4]]
    params = SamplingParams(temperature=0, repetition_penalty=repetition, frequency_penalty=frequency,
                            presence_penalty=presence)
    seqs = [seq_with(prompt, out, params) for out in outputs]
    got = controlled(logits, [params] * 3, seqs)
    want = torch.stack([penalized_reference(logits[i], prompt, outputs[i], repetition, frequency, presence)
                        for i in range(3)])
    torch.testing.assert_close(got, want)
    assert greedy_ids(logits, [params] * 3, seqs) == want.argmax(-1).tolist()


def test_rows_without_controls_keep_their_logits_and_the_input_is_not_changed():
    """The reported logprobs are the raw model's: the controls work on a copy."""
    logits = torch.randn(2, VOCAB)
    before = logits.clone()
    params = [SamplingParams(temperature=0, frequency_penalty=2.0), SamplingParams(temperature=0)]
    seqs = [seq_with([1], [logits[0].argmax().item()] * 3, params[0]), seq_with([1], [], params[1])]
    got = controlled(logits, params, seqs)
    assert torch.equal(logits, before) and torch.equal(got[1], logits[1]) and not torch.equal(got[0], logits[0])


def test_logit_bias_is_added_and_clamped_to_100():
    params = SamplingParams(temperature=0, logit_bias={"5": 250, 7: -3.5, 9: -1000})
    assert params.logit_bias == {5: 100.0, 7: -3.5, 9: -100.0}
    logits = torch.randn(1, VOCAB)
    want = logits.clone()
    want[0, 5] += 100
    want[0, 7] -= 3.5
    want[0, 9] -= 100
    torch.testing.assert_close(controlled(logits, [params], [seq_with([1], [], params)]), want)
    assert greedy_ids(logits, [params], [seq_with([1], [], params)]) == [5]


def test_allowed_token_ids_leave_only_those_tokens():
    logits = torch.randn(2, VOCAB)
    params = [SamplingParams(temperature=0, allowed_token_ids=[4, 11, 17]), SamplingParams(temperature=0)]
    got = controlled(logits, params, [seq_with([1], [], p) for p in params])
    want = torch.full((VOCAB,), float("-inf"))
    want[[4, 11, 17]] = logits[0, [4, 11, 17]]
    assert torch.equal(got[0], want) and torch.equal(got[1], logits[1])
    sampled = SamplingParams(temperature=1.5, allowed_token_ids=[4, 11, 17])
    draws = sample_ids(logits[:1].repeat(500, 1), [sampled] * 500, [None] * 500, torch.Generator().manual_seed(0),
                       TokenHistory([seq_with([1], [], sampled)] * 500))
    assert set(draws.tolist()) == {4, 11, 17}


@pytest.mark.parametrize("num_output,blocked", [(0, True), (2, True), (3, False)])
def test_min_tokens_blocks_eos_and_stop_ids_until_enough_output(num_output, blocked):
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS] = logits[0, 9] = 5.0
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9])
    seq = seq_with([2], [4] * num_output, params)
    got = controlled(logits, [params], [seq], eos_token_ids={EOS})
    assert (got[0, [EOS, 9]] == float("-inf")).all() == blocked
    assert torch.equal(got[0, 10:], logits[0, 10:])


def bad_words_params(*words: list[int]) -> SamplingParams:
    params = SamplingParams(temperature=0)
    params._bad_words_token_ids = [list(w) for w in words]
    return params


@pytest.mark.parametrize("output,blocked", [([], {7}), ([3], {7, 5}), ([3, 4], {7, 9}), ([4], {7}),
                                            ([2, 3, 4], {7, 9})])
def test_bad_words_block_a_words_last_token_where_the_output_ends_with_the_rest(output, blocked):
    """Words [7], [3, 5] and [3, 4, 9]: a prompt ending in the prefix does not count (vLLM: output tokens only)."""
    params = bad_words_params([7], [3, 5], [3, 4, 9])
    got = controlled(torch.zeros(1, VOCAB), [params], [seq_with([3, 4], output, params)])
    assert set((got[0] == float("-inf")).nonzero()[:, 0].tolist()) == blocked


def test_bad_words_become_token_ids_as_vllm_makes_them():
    class Words:  # a word-level tokenizer: " hello" is a token of its own
        ids = {"hello": [5], " hello": [9], "ab": [1, 2], " ab": [3, 4], "xy": [6, 7], " xy": [6, 8]}

        def encode(self, text, add_special_tokens=True):
            return self.ids[text]

    params = SamplingParams(bad_words=["hello", " ab", "xy"])
    params.bind_to_model(Words(), vocab_size=VOCAB)
    # a spaced form is kept when it is as long and starts with another token (" xy" starts like "xy")
    assert params.bad_words_token_ids == [[5], [9], [1, 2], [3, 4], [6, 7]]
    char_params = SamplingParams(bad_words=["ab"])
    char_params.bind_to_model(load_tokenizer(demo_model_dir()), vocab_size=128)
    assert char_params.bad_words_token_ids == [[71, 72]]  # the demo's " ab" is 3 characters: not kept


def bad_words_reference(words: list[list[int]], output: list[int]) -> set[int]:
    """vLLM's definition: a word's last token is blocked where the output ends with the rest of the word."""
    return {w[-1] for w in words if len(output) >= len(w) - 1 and output[len(output) - len(w) + 1:] == w[:-1]}


@pytest.mark.parametrize("seed", range(6))
def test_many_bad_words_block_what_their_definition_says_on_the_host_and_in_flight(seed):
    """Hundreds of words whose other tokens come from a few ids, so prefixes are shared and outputs end in many of
    them, and whose last tokens spread over the rest of the vocabulary, so each output blocks its own set."""
    rng = torch.Generator().manual_seed(seed)

    def draw(low, high, n=1):
        return torch.randint(low, high, (n,), generator=rng).tolist()
    words = [draw(2, 6, draw(1, 4)[0]) + draw(6, VOCAB) for _ in range(400)] + [[20], [21]]
    params = bad_words_params(*words)
    for _ in range(12):
        prompt, output = draw(2, 6, 4), draw(2, 6, draw(0, 6)[0])  # the prompt never counts
        want = bad_words_reference(words, output)
        on_host = controlled(torch.zeros(1, VOCAB), [params], [seq_with(prompt, output, params)])
        assert set((on_host[0] == float("-inf")).nonzero()[:, 0].tolist()) == want
        if output:
            in_flight = controlled(torch.zeros(1, VOCAB), [params], [seq_with(prompt, output[:-1], params)],
                                   in_flight=torch.tensor([output[-1]]))
            assert torch.equal(in_flight, on_host)


def test_bad_words_are_tokenized_in_one_batch_as_one_word_at_a_time_would():
    tokenizer = load_tokenizer(demo_model_dir())

    class OneAtATime:  # not callable: one encode per word
        def encode(self, text, add_special_tokens=True):
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)

    words = ["ab", " hello", "x y", "Once upon", "é", "  time", "a"]
    params = SamplingParams(bad_words=words)
    params.bind_to_model(tokenizer, vocab_size=128)
    one_by_one = SamplingParams(bad_words=words)
    one_by_one.bind_to_model(OneAtATime(), vocab_size=128)
    assert params.bad_words_token_ids == one_by_one.bad_words_token_ids and params.bad_words_token_ids


def test_params_bound_once_are_not_tokenized_again():
    """The API process binds a request's params, the engine core binds them again: the words are tokenized once,
    unless they changed."""
    class Counting:
        calls = 0

        def encode(self, text, add_special_tokens=True):
            Counting.calls += 1
            return [len(text) % 20 + 2]

    params = SamplingParams(bad_words=["one", "three"])
    params.bind_to_model(Counting(), vocab_size=VOCAB)
    calls = Counting.calls
    params.bind_to_model(Counting(), vocab_size=VOCAB)
    assert Counting.calls == calls
    params.bad_words = ["three", "seven"]
    params.bind_to_model(Counting(), vocab_size=VOCAB)
    assert Counting.calls > calls and params.bad_words_token_ids[0] == [len("three") + 2]


@pytest.mark.parametrize("temperature,min_p", [(1.0, 0.1), (0.7, 0.3), (2.0, 0.05), (1.0, 1.0)])
def test_min_p_keeps_tokens_at_least_min_p_times_the_top_probability(temperature, min_p):
    torch.manual_seed(1)
    logits = torch.randn(1, VOCAB) * 2
    probs, order = filtered_probs(logits, torch.tensor([temperature]), torch.tensor([VOCAB]), torch.tensor([1.0]),
                                  torch.tensor([min_p]))
    got = torch.zeros(VOCAB).scatter(0, order[0], probs[0] / probs[0].sum())
    torch.testing.assert_close(got, min_p_reference(logits[0], temperature, min_p))


def test_min_p_sampling_draws_only_kept_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08] + [0.0] * (VOCAB - 4)]) + 1e-30)
    params = SamplingParams(temperature=1.0, min_p=0.2)  # keeps p >= 0.1: tokens 0, 1, 2
    draws = sample_ids(logits.repeat(2000, 1), [params] * 2000, [None] * 2000, torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1, 2}


def test_greedy_rows_get_every_control_but_min_p():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 10.0
    params = SamplingParams(temperature=0, min_p=1.0, logit_bias={4: 20.0})
    assert greedy_ids(logits, [params], [seq_with([1], [], params)]) == [4]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, frequency_penalty=1.5, presence_penalty=0.5, repetition_penalty=1.7),
    SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9]),
    bad_words_params([7], [3, 5], [4, 3, 9], [6, 4, 3, 11])])
@pytest.mark.parametrize("in_flight_token", [3, 4, 6])
def test_a_token_in_flight_counts_as_the_last_output_token(params, in_flight_token):
    """The run-ahead step: the host lacks the newest token, which the device holds; same logits as if appended."""
    logits = torch.randn(1, VOCAB)
    prompt, output = [3, 8], [6, 4]
    on_host = controlled(logits, [params], [seq_with(prompt, output + [in_flight_token], params)],
                         eos_token_ids={EOS})
    on_device = controlled(logits, [params], [seq_with(prompt, output, params)], eos_token_ids={EOS},
                           in_flight=torch.tensor([in_flight_token]))
    assert torch.equal(on_host, on_device)


def test_a_batch_without_controls_never_runs_the_controls_code(monkeypatch):
    from atomlite.engine.sampling import sampler

    def fail(*args):
        raise AssertionError("controls applied to a batch without any")

    monkeypatch.setattr(sampler, "apply_logits_controls", fail)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_k=5, min_p=0.1)]
    assert sample_ids(torch.randn(2, VOCAB), params, [None, None], torch.Generator()).shape == (2,)


@pytest.mark.parametrize("kwargs,field", [
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-2.1), "frequency_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"), (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(min_p=1.5), "min_p"), (dict(min_p=-0.1), "min_p"), (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=20, max_tokens=10), "min_tokens"), (dict(min_tokens=1.5), "min_tokens"),
    (dict(logit_bias={"x": 1.0}), "logit_bias"), (dict(logit_bias={-3: 1.0}), "logit_bias"),
    (dict(logit_bias={3: float("inf")}), "logit_bias"), (dict(logit_bias=[3]), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"), (dict(allowed_token_ids=[1, -2]), "allowed_token_ids"),
    (dict(bad_words="abc"), "bad_words"), (dict(bad_words=["ok", " "]), "bad_words")])
def test_invalid_controls_are_errors_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs,field", [(dict(logit_bias={500: 1.0}), "logit_bias"),
                                          (dict(allowed_token_ids=[3, 128]), "allowed_token_ids")])
def test_token_ids_outside_the_vocabulary_are_errors_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs).bind_to_model(None, vocab_size=128)


def test_bad_words_without_a_tokenizer_is_an_error():
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words=["x"]).bind_to_model(None, vocab_size=128)


# -- the engine on the demo model ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo():
    return LLM(str(demo_model_dir()), dtype="float32", device="cpu", max_model_len=256)


def run_ahead_llm(overlap: bool) -> tuple[LLM, list[int]]:
    """The demo model with decode steps from the static buffers (no capture on CPU), so steps launch ahead as on
    a GPU; the list gets the batch size of each step launched ahead."""
    llm = LLM(str(demo_model_dir()), dtype="float32", device="cpu", max_model_len=256, overlap_decode=overlap)
    runner = llm.engine.runner
    runner.use_decode_graphs(8, llm.engine.config.max_model_len, capture=False)
    ahead, execute_ahead = [], runner.execute_ahead
    runner.execute_ahead = lambda seqs, ids: (ahead.append(len(seqs)), execute_ahead(seqs, ids))[1]
    return llm, ahead


def generate(llm: LLM, params: SamplingParams, prompt=PROMPT) -> list[int]:
    return llm.generate([prompt], params)[0].outputs[0].token_ids


def recording_raw_logits(monkeypatch) -> list[torch.Tensor]:
    """The logits the engine samples from at each step (the model's, before any control)."""
    seen, real = [], llm_engine.sample_ids

    def record(logits, *args):
        seen.append(logits.clone())
        return real(logits, *args)

    monkeypatch.setattr(llm_engine, "sample_ids", record)
    return seen


def test_logit_bias_of_100_makes_greedy_choose_that_token(demo):
    assert generate(demo, SamplingParams(temperature=0, max_tokens=8, logit_bias={"75": 100})) == [75] * 8


def test_allowed_token_ids_restrict_the_output(demo):
    allowed = [71, 72, 73, 6]
    out = generate(demo, SamplingParams(temperature=0.9, seed=3, max_tokens=24, allowed_token_ids=allowed))
    assert len(out) == 24 and set(out) <= set(allowed)


@pytest.mark.parametrize("stop", [dict(), dict(stop_token_ids=[75])])
def test_min_tokens_holds_back_eos_and_stop_ids(demo, stop):
    """Biased to stop at once, the sequence stops right after min_tokens instead."""
    stop_id = stop.get("stop_token_ids", [EOS])[0]
    params = dict(temperature=0, max_tokens=20, logit_bias={stop_id: 100}, **stop)
    assert generate(demo, SamplingParams(**params)) == [stop_id]
    out = demo.generate([PROMPT], SamplingParams(min_tokens=6, **params))[0].outputs[0]
    assert len(out.token_ids) == 7 and stop_id not in out.token_ids[:6] and out.token_ids[6] == stop_id
    assert out.finish_reason == "stop"


@pytest.mark.parametrize("penalty", [dict(frequency_penalty=2.0), dict(presence_penalty=2.0),
                                     dict(repetition_penalty=2.0),
                                     dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=1.0)])
def test_penalized_greedy_output_is_the_definition_applied_to_the_models_logits(demo, monkeypatch, penalty):
    """Each token is argmax of the penalty written out over that step's raw logits and the tokens before it; and
    the penalty changes the output."""
    plain = generate(demo, SamplingParams(temperature=0, max_tokens=30))
    raw = recording_raw_logits(monkeypatch)
    out = generate(demo, SamplingParams(temperature=0, max_tokens=30, **penalty))
    prompt = demo.tokenizer.encode(PROMPT)
    assert out != plain and len(raw) == len(out)
    for k, logits in enumerate(raw):
        want = penalized_reference(logits[0], prompt, out[:k], penalty.get("repetition_penalty", 1.0),
                                   penalty.get("frequency_penalty", 0.0), penalty.get("presence_penalty", 0.0))
        assert out[k] == want.argmax().item(), k


def test_bad_words_never_appear_in_the_output(demo):
    prompt = "Question: Ava has 7 pens and gets 5 more. How many pens does Ava have now?\nAnswer:"  # the README's
    plain = demo.generate([prompt], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0].text
    assert "= " in plain and "2" in plain
    text = demo.generate([prompt], SamplingParams(temperature=0, max_tokens=30, bad_words=["= ", "2"]))[0] \
        .outputs[0].text
    assert text != plain and "= " not in text and "2" not in text


def test_invalid_token_ids_are_refused_by_the_engine(demo):
    with pytest.raises(ValueError, match="allowed_token_ids"):
        demo.generate([PROMPT], SamplingParams(allowed_token_ids=[5, 4096]))


# Each controlled row gives other tokens when the in-flight token is left out of what its control counts (a few
# allowed tokens make the penalties decide between them at every step).
CONTROLLED_BATCH = [
    SamplingParams(temperature=0, max_tokens=24, allowed_token_ids=[71, 72, 73], frequency_penalty=2.0),
    SamplingParams(temperature=0, max_tokens=24, allowed_token_ids=[71, 72, 73, 74], repetition_penalty=3.0),
    SamplingParams(temperature=0, max_tokens=20),
    SamplingParams(temperature=0, max_tokens=24, min_tokens=10, logit_bias={EOS: 30}),
    SamplingParams(temperature=0.8, seed=5, max_tokens=24, bad_words=["= ", "Question", "3"],
                   presence_penalty=1.0, min_p=0.05),
]
BATCH_PROMPTS = [PROMPT, PROMPT, "The following are", "Hello", PROMPT]


def outputs(llm: LLM, params: list[SamplingParams], prompts=BATCH_PROMPTS) -> list[tuple]:
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(prompts, params)]


def test_controls_give_the_same_tokens_when_steps_run_ahead():
    """The step launched ahead samples before its sequences' newest tokens reach the host: penalties, min_tokens
    and bad words must count them all the same."""
    reading_first, _ = run_ahead_llm(overlap=False)
    overlapped, ahead = run_ahead_llm(overlap=True)
    want = outputs(reading_first, CONTROLLED_BATCH)
    assert outputs(overlapped, CONTROLLED_BATCH) == want
    assert ahead and max(ahead) == len(CONTROLLED_BATCH)
    assert len(want[3][0]) == 11 and want[3][0][-1] == EOS  # min_tokens held back a favoured EOS 10 steps
    alone = [outputs(reading_first, [p], [prompt])[0] for p, prompt in zip(CONTROLLED_BATCH, BATCH_PROMPTS)]
    assert want == alone  # each row's controls are its own, whatever the batch


# -- the server ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    llm = LLM(str(demo_model_dir()), dtype="float32", device="cpu", max_model_len=256)
    with running(make_app(llm.engine, NAME)) as base:
        yield base


def test_the_server_passes_every_control_through(server, demo):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    biased = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=5, temperature=0,
                                       logit_bias={"75": 100})
    assert biased.choices[0].text == "eeeee"
    controls = dict(frequency_penalty=1.5, presence_penalty=0.5)
    extra = dict(repetition_penalty=1.3, min_p=0.1, min_tokens=8, bad_words=["3"],
                 allowed_token_ids=list(range(5, 101)))
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=16,
                                          temperature=0, extra_body=extra, **controls)
    prompt = demo.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                                add_generation_prompt=True)
    want = demo.generate([demo.tokenizer.encode(prompt, add_special_tokens=False)],
                         SamplingParams(temperature=0, max_tokens=16, **controls, **extra))[0].outputs[0]
    assert chat.choices[0].message.content == want.text and "3" not in want.text


@pytest.mark.parametrize("body,field", [
    (dict(frequency_penalty=2.5), "frequency_penalty"), (dict(presence_penalty="1"), "presence_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"), (dict(min_p=2.0), "min_p"),
    (dict(min_tokens=-1), "min_tokens"), (dict(min_tokens=9), "min_tokens"),
    (dict(logit_bias={"abc": 1}), "logit_bias"), (dict(logit_bias={"5": "high"}), "logit_bias"),
    (dict(logit_bias={"4096": 1}), "logit_bias"), (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(allowed_token_ids=[1, 999]), "allowed_token_ids"), (dict(bad_words="3"), "bad_words"),
    (dict(bad_words=["  "]), "bad_words")])
def test_bad_control_values_are_a_400_naming_the_field(server, body, field):
    resp = httpx.post(f"{server}/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, **body}, timeout=10)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert field in error["message"] + str(error["param"]), error
