"""The output processor that the offline LLM and the server's engine client share: engine updates in, each request's
delta out; stop strings end a request once and ask the engine to abort it; failures reach the client as errors;
logprob entries get their tokens' texts."""
import pytest

from atomlite.demo.tokenizer import build_char_tokenizer
from atomlite.engine.output_processor import OutputProcessor, logprobs_with_texts
from atomlite.engine.updates import SeqUpdate
from atomlite.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def feed_one_by_one(processor: OutputProcessor, request_id: str, ids: list[int]) -> list:
    return [processor.process([SeqUpdate(request_id, [token])]) for token in ids]


def test_a_stop_string_across_updates_ends_the_request_once_and_asks_the_engine_to_abort_it(tokenizer):
    processor = OutputProcessor(tokenizer)
    state = processor.add("r", [2], SamplingParams(stop=["lo w"]))
    steps = feed_one_by_one(processor, "r", tokenizer.encode("hello world", add_special_tokens=False))
    deltas = [item for step in steps for _, item in step.outputs]
    assert "".join(d.text for d in deltas) == state.text == "hel"
    assert [d.finished for d in deltas] == [False] * 6 + [True] and deltas[-1].finish_reason == "stop"
    assert [step.stopped for step in steps] == [[]] * 6 + [["r"]] + [[]] * 4  # later tokens (a step ahead) ignored
    assert [step.num_finished for step in steps] == [0] * 6 + [1] + [0] * 4
    assert processor.requests == {}


def test_text_that_could_begin_a_stop_string_waits_until_it_cannot(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add("r", [2], SamplingParams(stop=["xyz"]))
    steps = feed_one_by_one(processor, "r", tokenizer.encode("abcd", add_special_tokens=False))
    assert [step.outputs[0][1].text for step in steps] == ["", "", "a", "b"]
    last = processor.process([SeqUpdate("r", [tokenizer.encode("e", add_special_tokens=False)[0]],
                                        finish_reason="length")])
    assert last.outputs[0][1].text == "cde" and last.outputs[0][1].finish_reason == "length"


def test_a_failed_update_reaches_the_client_as_an_error_and_ends_the_request(tokenizer):
    processor = OutputProcessor(tokenizer)
    for request_id in ("bad", "broken", "aborted"):
        processor.add(request_id, [2], SamplingParams())
    processor.abort("aborted")
    step = processor.process([SeqUpdate("bad", [], error="top_k must be -1 or at least 1", invalid=True),
                              SeqUpdate("broken", [], error="engine failure: RuntimeError: boom"),
                              SeqUpdate("aborted", [5])])
    errors = [item for _, item in step.outputs]
    assert [type(e) for e in errors] == [ValueError, RuntimeError]
    assert [str(e) for e in errors] == ["top_k must be -1 or at least 1", "engine failure: RuntimeError: boom"]
    assert step.num_finished == 2 and processor.requests == {}


def test_logprobs_get_their_tokens_texts_and_keep_the_engines_candidates(tokenizer):
    h, i, eos = tokenizer.convert_tokens_to_ids(["h", "i", "<eos>"])
    tokens = logprobs_with_texts(tokenizer, [h, i, eos], [None, {h: -0.5, i: -1.25}, {eos: -0.1}])
    assert [(t.text, t.logprob, t.candidates) for t in tokens] == [
        ("h", None, None), ("i", -1.25, [("h", -0.5), ("i", -1.25)]), ("<eos>", -0.1, [("<eos>", -0.1)])]
    assert [t.text for t in logprobs_with_texts(None, [7], [{7: -1.0}])] == ["<7>"]
