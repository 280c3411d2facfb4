"""The server's edges, over real HTTP: deep nesting and remote $refs are 400s, a request that can never be
admitted is a 400 saying why, the API key is checked in any scheme case and guards /metrics, POST bodies must be
JSON (415), and slow headers or bodies do not hold a connection."""
import json
import socket

import httpx
import openai
import pytest

from atomlite import LLM
from atomlite.engine.ipc.async_engine import AsyncEngine
from atomlite.errors import ConfigError
from atomlite.server import body_limit, timeouts
from atomlite.server.app import build_app, engine_client, make_app
from server_utils import running

NAME = "tiny"
OK = {"model": NAME, "prompt": "Hi", "max_tokens": 2}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def nested_text(depth: int) -> str:
    """A schema nested depth deep, as JSON text (json.dumps itself cannot write one 1000 deep)."""
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth


def nested(depth: int) -> dict:
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.fixture(scope="module")
def llm(random_model_dir):
    return LLM(str(random_model_dir), dtype="float32", device="cpu", max_model_len=64)


@pytest.fixture
def own_llm(random_model_dir):
    """An engine of the test's own, for an app of its own: `server` runs a core over `llm`'s."""
    return LLM(str(random_model_dir), dtype="float32", device="cpu", max_model_len=64)


@pytest.fixture(scope="module")
def server(llm):
    with running(make_app(llm.engine, NAME, max_waiting=4)) as base:
        yield base


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


@pytest.mark.parametrize("body,param", [
    ({**OK, "structured_outputs": {"json": nested_text(1000)}}, "structured_outputs.json"),
    ({**OK, "structured_outputs": {"json": nested(200)}}, None),
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": nested(300)}}},
     None),
])
def test_deep_nesting_is_a_400(server, body, param):
    route = "chat/completions" if "messages" in body else "completions"
    error = error_of(httpx.post(f"{server}/v1/{route}", json=body, timeout=30), 400)
    assert "nest" in error["message"] or "depth" in error["message"], error
    if param:
        assert error["param"] == param


def test_a_deeply_nested_tool_schema_forced_is_a_400(server):
    tool = {"type": "function", "function": {"name": "f", "parameters": nested(60)}}
    body = {**CHAT, "tools": [tool], "tool_choice": "required"}
    resp = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code in (200, 400), resp.text  # never a 500


def test_a_remote_ref_is_a_400(server):
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.com/schema.json"}}}
    error = error_of(httpx.post(f"{server}/v1/chat/completions", json={
        **CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}), 400)
    assert "example.com" in error["message"] and "outside the schema" in error["message"]
    local = {"$defs": {"s": {"type": "string"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/s"}}}
    resp = httpx.post(f"{server}/v1/chat/completions", json={
        **CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": local}}},
        timeout=60)  # it generates: a grammar compile and decode steps on a shared CPU
    assert resp.status_code != 500, resp.text


def test_a_request_that_can_never_be_admitted_is_a_400_saying_why(server):
    error = error_of(httpx.post(f"{server}/v1/completions", json={**OK, "prompt": ["Hi"] * 5}), 400)
    assert "--max-waiting" in error["message"] and "never" in error["message"]
    error = error_of(httpx.post(f"{server}/v1/completions", json={**OK, "n": 5}), 400)
    assert error["param"] == "n"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_a_body_not_sent_as_json_is_a_415(server, content_type):
    headers = {"content-type": content_type} if content_type else {}
    error = error_of(httpx.post(f"{server}/v1/completions", content=json.dumps(OK).encode(), headers=headers), 415)
    assert "application/json" in error["message"]


def test_json_with_a_charset_is_json(server):
    resp = httpx.post(f"{server}/v1/completions", content=json.dumps(OK).encode(),
                      headers={"content-type": "Application/JSON; charset=utf-8"})
    assert resp.status_code == 200, resp.text


def test_the_api_key_takes_any_scheme_case_and_guards_metrics(own_llm):
    llm = own_llm
    # timeout: a completion on a busy 2-core machine can outlast httpx's 5 s default
    with running(make_app(llm.engine, NAME, api_key="s3cret")) as base:
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert httpx.post(f"{base}/v1/completions", json=OK, timeout=60,
                              headers={"Authorization": f"{scheme} s3cret"}).status_code == 200
        for header in ("Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", ""):
            assert httpx.post(f"{base}/v1/completions", json=OK, headers={"Authorization": header},
                              timeout=60).status_code == 401
        assert httpx.get(f"{base}/metrics").status_code == 401
        assert httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(f"{base}/health").status_code == 200
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="s3cret")
        assert client.models.list().data[0].id == NAME


def test_a_second_client_over_an_engine_another_drives_is_refused(server, llm):
    """Two core threads over one engine would each step it and split a request's updates between their clients
    (the one that missed the first update then met a request without its queue time, and hung it)."""
    with pytest.raises(ConfigError, match="already runs under another engine client"):
        engine_client(llm.engine).start()
    with pytest.raises(RuntimeError, match="served by a running server"):
        llm.generate("Hi")
    assert httpx.post(f"{server}/v1/completions", json=OK, timeout=60).status_code == 200


@pytest.mark.parametrize("max_tokens", [1, 2])  # the failing update is the request's last, or not
def test_a_failure_on_a_steps_outputs_fails_the_open_requests_instead_of_hanging_them(own_llm, monkeypatch,
                                                                                       max_tokens):
    def broken(*args):
        raise TypeError("a bug in the metrics")

    monkeypatch.setattr(AsyncEngine, "_observe", broken)
    with running(make_app(own_llm.engine, NAME)) as base:
        resp = httpx.post(f"{base}/v1/completions", json={**OK, "max_tokens": max_tokens}, timeout=60)
        assert resp.status_code >= 500 and "a bug in the metrics" in resp.json()["error"]["message"], resp.text
        assert httpx.get(f"{base}/health").status_code == 503


def raw(base: str, data: bytes, timeout: float = 15) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_headers_that_stop_halfway_close_the_connection(server, monkeypatch):
    monkeypatch.setattr(timeouts, "HEADER_TIMEOUT_S", 0.5)
    assert raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app") == b""
    assert httpx.get(f"{server}/health").status_code == 200


def test_a_body_that_stops_halfway_is_a_408(server, monkeypatch):
    monkeypatch.setattr(body_limit, "BODY_TIMEOUT_S", 0.5)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    answer = raw(server, head + b'{"model": ')
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within" in answer, answer[:300]


def test_responses_name_the_first_served_model_name_as_vllm(own_llm):
    with running(build_app(engine_client(own_llm.engine), ["first", "second"])) as base:
        for name in ("first", "second"):
            assert httpx.post(f"{base}/v1/completions", json={**OK, "model": name}).json()["model"] == "first"
            chat = httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "model": name, "stream": True})
            chunks = [json.loads(line[6:]) for line in chat.text.splitlines() if line.startswith("data: {")]
            assert chunks and all(chunk["model"] == "first" for chunk in chunks)
