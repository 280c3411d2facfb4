"""Grammars compile off the engine's step loop: a request waits for its grammar while the batch runs on; one that
does not compile within the limit fails naming its field, nothing of it kept; compiled grammars are cached by hash
and bounded in bytes."""
import json
import os
import threading
import time

import httpx
import pytest

from atomlite import LLM, SamplingParams, StructuredOutputsParams
from atomlite.engine.sampling import structured
from atomlite.engine.sampling.grammar_worker import GRAMMAR_NICENESS
from atomlite.server.app import make_app
from server_utils import running

NAME = "tiny"
BIG_ENUM = {"type": "string", "enum": [f"value{i}" for i in range(20_000)]}  # seconds to compile here


@pytest.fixture(scope="module")
def llm(random_model_dir):
    return LLM(str(random_model_dir), dtype="float32", device="cpu", max_model_len=256)


def run_until_done(engine) -> list:
    updates = []
    while engine.has_unfinished():
        updates += engine.step()
    return updates


def test_a_running_sequence_finishes_while_a_slow_grammar_compiles_and_times_out(llm):
    engine = llm.engine
    engine.structured.compile_timeout_s = 1.0
    try:
        engine.add_request("plain", "Hello", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        engine.add_request("slow", "Hello", SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
            json=BIG_ENUM)))
        process = grammar_process(engine)
        updates = run_until_done(engine)
    finally:
        engine.structured.compile_timeout_s = structured.COMPILE_TIMEOUT_S
    assert process.wait(5) is not None  # killed at its limit, not left to finish unseen
    plain = [u for u in updates if u.request_id == "plain"]
    slow = [u for u in updates if u.request_id == "slow"]
    assert sum(len(u.token_ids) for u in plain) == 8 and plain[-1].finish_reason == "length"
    assert len(slow) == 1 and slow[0].invalid and "structured_outputs.json" in slow[0].error
    assert "did not compile within" in slow[0].error and not slow[0].token_ids
    assert "slow" not in engine.requests and not engine.structured.compiling
    with pytest.raises(ValueError, match="did not compile within"):  # the same spec again: refused at once
        engine.add_request("again", "Hello", SamplingParams(structured_outputs=StructuredOutputsParams(
            json=BIG_ENUM)))


def grammar_process(engine):
    """The grammar process once it runs (its imports take a few seconds)."""
    deadline = time.monotonic() + 120
    while engine.structured._worker._process is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return engine.structured._worker._process


def test_the_grammar_process_runs_at_a_lower_priority_and_a_dropped_requests_compile_is_killed(llm):
    engine = llm.engine
    spec = StructuredOutputsParams(json={**BIG_ENUM, "enum": BIG_ENUM["enum"] + ["dropped"]})
    engine.add_request("dropped", "Hello", SamplingParams(max_tokens=2, structured_outputs=spec))
    process = grammar_process(engine)
    nicer = min(19, os.getpriority(os.PRIO_PROCESS, 0) + GRAMMAR_NICENESS)
    deadline = time.monotonic() + 30  # the process sets its niceness as it starts
    while os.getpriority(os.PRIO_PROCESS, process.pid) != nicer and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.getpriority(os.PRIO_PROCESS, process.pid) == nicer
    engine.abort("dropped")
    assert process.wait(30) is not None and not engine.structured.compiling and not engine.has_unfinished()
    out = llm.generate("Hi", SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no"])))  # the next compile starts a new process
    assert out[0].outputs[0].text in ("yes", "no")


def test_a_compiled_grammar_is_cached_by_hash_and_reused(llm):
    engine = llm.engine
    spec = StructuredOutputsParams(choice=["yes", "no"])
    out = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=4, structured_outputs=spec))
    assert out[0].outputs[0].text in ("yes", "no")
    keys = list(engine.structured._compiled)
    assert all(isinstance(k, bytes) and len(k) == 33 for k in keys)  # sha256 + skip_special_tokens, not the text
    engine.add_request("cached", "Hi", SamplingParams(max_tokens=2, structured_outputs=spec))
    assert not engine.structured.compiling  # a cache hit is ready at once
    run_until_done(engine)


def test_the_cache_stays_within_its_bytes(llm, monkeypatch):
    engine = llm.engine
    monkeypatch.setattr(structured, "MAX_CACHED_GRAMMAR_BYTES", 1)  # nothing fits: nothing is kept
    engine.structured._compiled.clear()
    engine.structured._compiled_bytes = 0
    llm.generate("Hi", SamplingParams(max_tokens=2, structured_outputs=StructuredOutputsParams(regex="[a-z]{3}")))
    assert not engine.structured._compiled and engine.structured._compiled_bytes == 0


def test_over_http_a_grammar_past_its_limit_is_a_400_naming_the_field_while_a_stream_runs(llm):
    engine = llm.engine
    with running(make_app(engine, NAME)) as base:
        engine.structured.compile_timeout_s = 1.0
        try:
            stream_done = {}

            def stream():
                with httpx.stream("POST", f"{base}/v1/completions", timeout=120, json={
                        "model": NAME, "prompt": "Hi", "max_tokens": 40, "ignore_eos": True, "stream": True}) as r:
                    stream_done["lines"] = [line for line in r.iter_lines() if line.startswith("data:")]

            thread = threading.Thread(target=stream)
            thread.start()
            schema = {**BIG_ENUM, "enum": BIG_ENUM["enum"] + ["other"]}  # not the spec the engine refused before
            resp = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
                "model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
            thread.join(120)
        finally:
            engine.structured.compile_timeout_s = structured.COMPILE_TIMEOUT_S
        assert resp.status_code == 400 and "did not compile within" in resp.json()["error"]["message"], resp.text
        lines = stream_done["lines"]
        assert lines[-1] == "data: [DONE]" and '"finish_reason": "length"' in lines[-2]
        assert not any('"error"' in line for line in lines)


def test_a_grammar_process_that_died_is_replaced_by_the_next_compile(llm):
    engine = llm.engine
    spec = StructuredOutputsParams(regex="[a-c]{2}")
    llm.generate("Hi", SamplingParams(max_tokens=2, structured_outputs=StructuredOutputsParams(regex="[x-z]{2}")))
    grammar_process(engine).kill()  # out of memory, say, between two compiles
    out = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=4, structured_outputs=spec))
    assert len(out[0].outputs[0].text) == 2 and set(out[0].outputs[0].text) <= set("abc")
