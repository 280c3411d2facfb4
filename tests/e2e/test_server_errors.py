"""Malformed requests get a 4xx in OpenAI's error shape, never a 5xx or a hung connection."""
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from atomlite import LLM
from atomlite.accuracy.runner import SERVED_NAME, start_server
from atomlite.server.app import make_app
from server_utils import running, wait_for_idle

NAME = "tiny"
OK = {"model": NAME, "prompt": "Hi", "max_tokens": 2}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
# A body parsed on the event loop held /health for 0.45 s and more; a busy 2-core machine answers in up to ~0.15 s.
HEALTH_BOUND_S = 0.25


@pytest.fixture(scope="module")
def model_dir(random_model_dir):
    return random_model_dir


@pytest.fixture(scope="module")
def server(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=64)
    with running(make_app(llm.engine, NAME)) as base:
        yield base


BAD = [
    ("completions", {**OK, "priority": 3}, "Priority scheduling is not enabled"),
    ("chat/completions", {**CHAT, "priority": -1}, "priority"),
    ("completions", {**OK, "priority": "high"}, "priority"),
    ("completions", {**OK, "max_tokens": -1}, "max_tokens"),
    ("completions", {**OK, "max_tokens": 0}, "max_tokens"),
    ("completions", {**OK, "max_tokens": 10**9}, "maximum context length"),
    ("completions", {**OK, "max_tokens": "5"}, "max_tokens"),
    ("completions", {**OK, "max_tokens": 2.5}, "max_tokens"),
    ("completions", {**OK, "prompt": "x" * 100}, "context length"),
    ("completions", {**OK, "prompt": ""}, "prompt"),
    ("completions", {**OK, "prompt": []}, "prompt"),
    ("completions", {**OK, "prompt": [[]]}, "prompt"),
    ("completions", {**OK, "prompt": [1, "a"]}, "prompt"),
    ("completions", {**OK, "prompt": [10**7]}, "token ids"),
    ("completions", {**OK, "prompt": [-1]}, "prompt"),
    ("completions", {**OK, "prompt": None}, "prompt"),
    ("completions", {"model": NAME}, "prompt"),
    ("completions", {**OK, "temperature": -0.5}, "temperature"),
    ("completions", {**OK, "temperature": "hot"}, "temperature"),
    ("completions", {**OK, "top_p": 0}, "top_p"),
    ("completions", {**OK, "top_p": 1.5}, "top_p"),
    ("completions", {**OK, "top_k": -2}, "top_k"),  # 0 and -1 are off, as in vLLM
    ("completions", {**OK, "n": 0}, "n"),
    ("completions", {**OK, "n": 10_000}, "n"),
    ("completions", {**OK, "stop": 5}, "stop"),
    ("completions", {**OK, "stop": [""]}, "stop"),
    ("completions", {**OK, "stop": ["a"] * 17}, "at most 16"),
    ("completions", {**OK, "logit_bias": {"a": 1.0}}, "digit strings"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, "text parts"),
    ("completions", {**OK, "logprobs": 1000}, "logprobs"),
    ("completions", {**OK, "logprobs": -2}, "logprobs"),
    ("completions", {**OK, "echo": "yes"}, "echo"),
    ("completions", {**OK, "stream": "true"}, "stream"),
    ("completions", {**OK, "seed": "abc"}, "seed"),
    ("completions", {**OK, "seed": 2**70}, "seed"),
    ("completions", {**OK, "prompt": [2**70]}, "token ids"),
    ("completions", {**OK, "prompt": [[5], [2**70]], "echo": True}, "token ids"),
    ("completions", {**OK, "frequency_penalty": 2.5}, "frequency_penalty"),
    ("chat/completions", {**CHAT, "messages": []}, "messages"),
    ("chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user"}]}, "content"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": 42}]}, "content"),
    ("chat/completions", {**CHAT, "messages": "hello"}, "messages"),
    ("chat/completions", {**CHAT, "max_completion_tokens": -4}, "max_completion_tokens"),
    ("chat/completions", {**CHAT, "top_logprobs": 3}, "logprobs"),
    ("chat/completions", {**CHAT, "top_p": 0.0}, "top_p"),
]


@pytest.mark.parametrize("route,body,needle", BAD, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(BAD)])
def test_malformed_request_is_a_400_with_a_message(server, route, body, needle):
    resp = httpx.post(f"{server}/v1/{route}", json=body, timeout=10)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and needle in error["message"] + str(error["param"])
    # what the field takes, not pydantic's internals (a union's branch types, its error class)
    assert not any(tag in error["message"] for tag in ("constrained-", ".str", "Value error", "[key]", "function-")), \
        error["message"]


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00garbage", b"", b"[1, 2]", b'"just a string"'])
def test_unparseable_body_is_a_400(server, content):
    resp = httpx.post(f"{server}/v1/completions", content=content, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"]


def test_a_body_that_is_not_utf8_says_so(server):
    resp = httpx.post(f"{server}/v1/completions", content=b'{"model": "tiny", "prompt": "\xff\xfe"}',
                      headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "UTF-8" in resp.json()["error"]["message"], resp.text


def test_a_5mb_body_is_a_413_at_once_while_health_stays_fast(server):
    import threading
    body = b'{"model": "tiny", "prompt": [' + b",".join([b"7"] * 2_500_000) + b"]}"  # 5 MB
    health = []

    def poll():
        for _ in range(20):
            start = time.perf_counter()
            assert httpx.get(f"{server}/health").status_code == 200
            health.append(time.perf_counter() - start)

    poller = threading.Thread(target=poll)
    poller.start()
    start = time.perf_counter()
    resp = httpx.post(f"{server}/v1/completions", content=body, headers={"content-type": "application/json"})
    took = time.perf_counter() - start
    poller.join()
    assert resp.status_code == 413 and "--max-request-size" in resp.json()["error"]["message"], resp.text
    assert took < 1.0 and max(health) < HEALTH_BOUND_S, (took, max(health))


def test_a_large_body_under_the_limit_is_parsed_while_health_stays_fast(server):
    """1 MB of token ids (a 500k-token prompt): validated in the server's parsing process (on the event loop,
    pydantic held it for about 0.45 s here), so /health keeps answering; the prompt is then too long for the
    model: a 400 naming the lengths."""
    import threading
    body = b'{"model": "tiny", "prompt": [' + b",".join([b"7"] * 500_000) + b"]}"
    health, done = [], threading.Event()

    def poll():
        while not done.is_set():
            start = time.perf_counter()
            assert httpx.get(f"{server}/health").status_code == 200
            health.append(time.perf_counter() - start)
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    resp = httpx.post(f"{server}/v1/completions", content=body, headers={"content-type": "application/json"},
                      timeout=60)
    done.set()
    poller.join()
    assert resp.status_code == 400 and "tokens" in resp.json()["error"]["message"], resp.text
    # How many probes fit depends on how fast this machine parses; each one that ran overlapped the request.
    assert health and max(health) < HEALTH_BOUND_S, health


def test_a_chunked_body_past_the_limit_is_a_413(server):
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(5):
            yield b"x" * 2**20
        yield b'"}'

    resp = httpx.post(f"{server}/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413 and resp.json()["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_a_404(server):
    resp = httpx.post(f"{server}/v1/completions", json={**OK, "model": "gpt-9"})
    assert resp.status_code == 404 and "gpt-9" in resp.json()["error"]["message"]


def test_no_blocks_are_held_after_rejections(server):
    text = wait_for_idle(server)
    assert all(float(l.rsplit(" ", 1)[1]) == 0 for l in text.splitlines() if l.startswith("atomlite:kv_blocks_used"))
    assert httpx.post(f"{server}/v1/completions", json=OK).status_code == 200


def test_api_key_is_required_when_set(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=64)
    with running(make_app(llm.engine, NAME, api_key="s3cret")) as base:
        assert httpx.post(f"{base}/v1/completions", json=OK).status_code == 401
        wrong = httpx.post(f"{base}/v1/completions", json=OK, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        right = httpx.post(f"{base}/v1/completions", json=OK, headers={"Authorization": "Bearer s3cret"})
        assert right.status_code == 200
        assert httpx.get(f"{base}/health").status_code == 200


def test_full_waiting_queue_is_a_503_and_the_rest_complete(model_dir):
    import asyncio
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=256, max_num_seqs=1)
    with running(make_app(llm.engine, NAME, max_waiting=2)) as base:
        async def main():
            async with httpx.AsyncClient(base_url=base, timeout=60) as c:
                body = {**OK, "max_tokens": 60, "ignore_eos": True}
                return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(12)))
        codes = sorted(r.status_code for r in asyncio.run(main()))
        assert 503 in codes and 200 in codes and set(codes) <= {200, 503}
        wait_for_idle(base)


def test_admission_counts_sequences_admitted_a_moment_ago(model_dir):
    """Each admitted sequence is queued at once: a burst cannot pass admission before any of it is queued (it
    did when sequences were queued only once their stream was first read: 12 requests, max 2 waiting, no 503)."""
    import asyncio

    from atomlite.engine.ipc.async_engine import AsyncEngine, QueueFull
    from atomlite.sampling_params import SamplingParams
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=256, max_num_seqs=1)
    engine = AsyncEngine.over(llm.engine, max_waiting=2)
    engine.start()

    async def burst():
        gens = []
        try:
            for i in range(4):  # at most 1 running + 2 waiting: the 4th admission must fail, whatever the timing
                engine.admit(1)
                gens.append(engine.generate(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True)))
        finally:
            for gen in gens:
                await gen.aclose()
        return len(gens)

    try:
        with pytest.raises(QueueFull):
            asyncio.run(burst())
    finally:
        engine.shutdown()


def _sigterm_during_stream(proc, base: str, max_tokens: int, while_draining=lambda: None) -> list[str]:
    """Streams a completion, sends SIGTERM after its first event, runs while_draining; returns the later events."""
    with httpx.stream("POST", f"{base}/v1/completions", timeout=60,
                      json={**OK, "model": SERVED_NAME, "max_tokens": max_tokens, "ignore_eos": True,
                            "stream": True}) as resp:
        lines = resp.iter_lines()
        assert next(lines).startswith("data:")
        proc.send_signal(signal.SIGTERM)
        while_draining()
        return [line for line in lines if line]


def test_sigterm_finishes_in_flight_requests_and_exits_cleanly(model_dir, tmp_path):
    proc, base = start_server(model_dir, ["--dtype", "float32", "--max-model-len", "512"], tmp_path / "server.log")
    try:
        rest = _sigterm_during_stream(proc, base, 300)
        assert rest[-1] == "data: [DONE]"
        assert '"finish_reason": "length"' in rest[-2]
        assert proc.wait(30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base}/health")
    finally:
        proc.kill()


def test_sigterm_past_the_timeout_ends_streams_with_an_error_while_health_says_503(model_dir, tmp_path):
    log = tmp_path / "server.log"
    proc, base = start_server(model_dir, ["--dtype", "float32", "--max-model-len", "512", "--shutdown-timeout",
                                          "0.5"], log)
    try:
        seen = []

        def while_draining():
            time.sleep(0.1)
            seen.append(httpx.get(f"{base}/health").status_code)
            seen.append(httpx.post(f"{base}/v1/completions", json={**OK, "model": SERVED_NAME}).status_code)

        rest = _sigterm_during_stream(proc, base, 480, while_draining)
        assert seen == [503, 503]
        assert rest[-1] == "data: [DONE]"
        assert '"error"' in rest[-2] and "--shutdown-timeout" in rest[-2], rest[-2]
        assert proc.wait(30) == 0
        text = log.read_text()
        assert "draining: 1 requests in flight" in text and "ended 1 requests with an error" in text
        assert "Traceback" not in text
    finally:
        proc.kill()


def _serve_on(port: int, model) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atomlite.cli", "serve", "--model", str(model), "--port", str(port)],
                          capture_output=True, text=True, timeout=120)


def test_taken_port_is_one_line_before_any_loading(model_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve_on(port, model_dir)
        assert result.returncode == 2 and "serving" not in result.stdout, result.stdout + result.stderr
        assert result.stderr == f"error: port {port} on 127.0.0.1 is already in use (another server?): stop it or " \
                                f"pick another --port\n"
        # A model that cannot load still gets the port's error: the port is checked before anything loads.
        assert _serve_on(port, tmp_path / "nowhere").stderr == result.stderr


def test_stream_whose_client_left_before_the_headers_aborts_its_sequences(model_dir):
    """Starlette never starts the body when sending the headers fails, so the body's own cleanup never runs: the
    response closes the sequences itself (before, they ran on to max_tokens). The real engine, a real
    EventStream; only the ASGI send is a stand-in, failing as uvicorn's does for a client that has gone."""
    import asyncio

    from starlette.requests import ClientDisconnect

    from atomlite.engine.ipc.async_engine import AsyncEngine
    from atomlite.sampling_params import SamplingParams
    from atomlite.server.api import EventStream
    from atomlite.server.metrics import ServerMetrics
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=256, max_num_seqs=1)
    metrics = ServerMetrics()
    engine = AsyncEngine.over(llm.engine, metrics=metrics)
    engine.start()

    async def events():
        yield "never read"

    async def client_gone(message):
        raise OSError("client disconnected")

    async def receive():
        return {"type": "http.disconnect"}

    async def hang_up():
        gens = [engine.generate(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=200, ignore_eos=True))
                for i in range(2)]
        with pytest.raises(ClientDisconnect):
            await EventStream(events(), gens)({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, client_gone)

    def finished(reason):
        return metrics.registry.get_sample_value("atomlite:request_finished_total", {"reason": reason}) or 0

    try:
        asyncio.run(hang_up())
        deadline = time.monotonic() + 60
        while finished("abort") + finished("length") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert finished("abort") == 2 and finished("length") == 0
        time.sleep(0.6)  # the engine thread updates its gauges within its 0.5 s idle wait
        assert kv_used(metrics) and all(value == 0 for value in kv_used(metrics))
    finally:
        engine.shutdown()


def kv_used(metrics) -> list[float]:
    return [sample.value for family in metrics.registry.collect() for sample in family.samples
            if sample.name == "atomlite:kv_blocks_used"]


def test_priority_requests_are_served_under_the_priority_policy(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=64, scheduling_policy="priority")
    with running(make_app(llm.engine, NAME)) as base:
        for body, route in ((OK, "completions"), (CHAT, "chat/completions")):
            resp = httpx.post(f"{base}/v1/{route}", json={**body, "priority": -5}, timeout=30)
            assert resp.status_code == 200, resp.text


def test_offline_priority_needs_the_priority_policy(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="Priority scheduling is not enabled"):
        llm.generate(["Hi"], priority=[1])
    with pytest.raises(ValueError, match="2 priorities for 1 prompts"):
        llm.generate(["Hi"], priority=[0, 0])
