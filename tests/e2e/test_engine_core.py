"""`atomlite serve` runs its engine core in a process of its own: found, fed by many streams with the offline
API's greedy outputs, freeing a gone client's KV blocks there, and failing clearly (not hanging) when it dies."""
import asyncio
import json
import os
import re
import signal
import statistics
import threading
import time

import httpx
import openai
import pytest

from atomlite import LLM, SamplingParams
from atomlite.accuracy.runner import SERVED_NAME, start_server, stop_server
from atomlite.demo import demo_model_dir
from server_utils import metric, wait_for_idle

FLAGS = ["--dtype", "float32", "--max-model-len", "512"]
PROMPTS = [f"Question: {a} + {b} = ?\nAnswer:" for a in range(4) for b in range(8)]  # 32


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    proc, base = start_server(demo_model_dir(), FLAGS, log)
    try:
        yield proc, base, log
    finally:
        stop_server(proc)


def core_pid(log) -> int:
    return int(re.search(r"engine core: process (\d+)", log.read_text()).group(1))


def parent_of(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"PPid:\s+(\d+)", status).group(1))


def test_the_engine_core_is_a_child_process_of_the_server(server):
    proc, _, log = server
    pid = core_pid(log)
    assert pid != proc.pid and parent_of(pid) == proc.pid


def test_32_concurrent_streams_give_the_offline_greedy_outputs(server):
    _, base, _ = server
    params = SamplingParams(temperature=0, max_tokens=24)
    want = [o.outputs[0].text for o in LLM(str(demo_model_dir()), dtype="float32", max_model_len=512)
            .generate(PROMPTS, params)]

    async def stream(client, prompt):
        chunks = await client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=24, temperature=0,
                                                 stream=True)
        return "".join([c.choices[0].text async for c in chunks])

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        try:
            return await asyncio.gather(*(stream(client, p) for p in PROMPTS))
        finally:
            await client.close()

    assert asyncio.run(main()) == want


def test_health_answers_fast_while_32_streams_run(server):
    _, base, _ = server
    latencies, done = [], threading.Event()

    def poll_health():
        with httpx.Client(base_url=base, timeout=5) as c:
            while not done.is_set():
                start = time.perf_counter()
                assert c.get("/health").status_code == 200
                latencies.append(time.perf_counter() - start)
                time.sleep(0.01)

    async def stream(c, i):
        body = {"model": SERVED_NAME, "prompt": PROMPTS[i], "max_tokens": 300, "ignore_eos": True, "stream": True,
                "return_token_ids": True}
        async with c.stream("POST", "/v1/completions", json=body) as resp:
            chunks = [json.loads(line[5:]) async for line in resp.aiter_lines()
                      if line.startswith("data:") and line != "data: [DONE]"]
        # a loaded server may merge several steps' tokens into one chunk, so count tokens, not chunks
        return sum(len(chunk["choices"][0]["token_ids"]) for chunk in chunks)

    async def main():
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=httpx.Limits(max_connections=40)) as c:
            return await asyncio.gather(*(stream(c, i) for i in range(32)))

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        events = asyncio.run(main())
    finally:
        done.set()
        poller.join()
    assert events == [300] * 32  # every stream ran to the end while /health was polled
    p99 = statistics.quantiles(latencies, n=100)[98]
    assert len(latencies) > 50 and p99 < 0.05, f"/health p99 {p99 * 1e3:.1f} ms over {len(latencies)} calls"


def test_a_client_that_hangs_up_frees_its_blocks_in_the_core(server):
    _, base, _ = server

    async def hang_up(c, i):
        body = {"model": SERVED_NAME, "prompt": PROMPTS[i], "max_tokens": 400, "ignore_eos": True, "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as resp:
            seen = 0
            async for line in resp.aiter_lines():
                seen += line.startswith("data:")
                if seen >= 3:
                    text = (await c.get("/metrics")).text
                    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                               if l.startswith("atomlite:kv_blocks_used"))

    async def main():
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            return await asyncio.gather(*(hang_up(c, i) for i in range(10)))

    aborted = 'atomlite:request_finished_total{reason="abort"}'
    before = httpx.get(f"{base}/metrics").text
    before = metric(before, aborted) if aborted in before else 0
    used_while_streaming = asyncio.run(main())
    assert max(used_while_streaming) > 0
    text = wait_for_idle(base)
    assert metric(text, aborted) - before == 10
    assert all(float(l.rsplit(" ", 1)[1]) == 0 for l in text.splitlines() if l.startswith("atomlite:kv_blocks_used"))


def test_metrics_carry_vllm_series(server):
    _, base, _ = server
    httpx.post(f"{base}/v1/completions", json={"model": SERVED_NAME, "prompt": PROMPTS[0], "max_tokens": 4})
    text = wait_for_idle(base)
    for name in ("atomlite:num_preemptions_total", "atomlite:prefix_cache_queries_total",
                 "atomlite:prefix_cache_hits_total", "atomlite:request_queue_time_seconds_count",
                 "atomlite:e2e_request_latency_seconds_count", "atomlite:request_prefill_time_seconds_count",
                 "atomlite:request_decode_time_seconds_count", "atomlite:iteration_tokens_total_count"):
        assert name in text, name
    assert metric(text, "atomlite:e2e_request_latency_seconds_count") >= 1
    assert metric(text, "atomlite:prefix_cache_queries_total") >= len(PROMPTS[0])
    assert metric(text, "atomlite:iteration_tokens_total_sum") >= len(PROMPTS[0])
    # the CPU runs every pass eager (decode graphs are captured on GPUs only): the prefill and three decode steps
    assert metric(text, "atomlite:forward_passes_total", path="eager") >= 4


def test_a_killed_core_fails_open_requests_and_the_server_exits(tmp_path):
    log = tmp_path / "server.log"
    proc, base = start_server(demo_model_dir(), FLAGS, log)
    try:
        async def stream(c, i):
            body = {"model": SERVED_NAME, "prompt": PROMPTS[i], "max_tokens": 450, "ignore_eos": True,
                    "stream": True}
            lines = []
            async with c.stream("POST", "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line:
                        lines.append(line)
                    if len(lines) == 3 and i == 0:
                        os.kill(core_pid(log), signal.SIGKILL)
            return lines

        async def main():
            async with httpx.AsyncClient(base_url=base, timeout=60) as c:
                return await asyncio.wait_for(asyncio.gather(*(stream(c, i) for i in range(4))), 30)

        for lines in asyncio.run(main()):
            assert lines[-1] == "data: [DONE]"
            assert '"error"' in lines[-2] and "engine core process exited" in lines[-2], lines[-2]
        assert proc.wait(30) == 1
        assert "engine core process exited" in log.read_text()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base}/health")
    finally:
        stop_server(proc)


def _exited(pid: int) -> bool:
    try:
        return "State:\tZ" in open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return True


def test_a_core_whose_server_was_killed_exits(tmp_path):
    log = tmp_path / "server.log"
    proc, _ = start_server(demo_model_dir(), FLAGS, log)
    pid = core_pid(log)
    proc.kill()  # no drain, no stop command: the core must notice on its own
    proc.wait(10)
    deadline = time.monotonic() + 15
    while not _exited(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _exited(pid)
