"""`atomlite bench serve`: random token prompts (completions), or chats carrying images, streamed from a running
OpenAI-compatible server (atomlite serve or any other), at a request rate and a concurrency cap. Metric names are
those of vLLM's `bench serve`. While they run, /health is asked every HEALTH_INTERVAL_S: its latency is how long any
other client waits on the server's event loop.

Time to first token and inter-token latency count the chunks that carry a token: text, or token ids (requested with
vLLM's `return_token_ids`), so a server without a tokenizer is timed too."""
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx

PERCENTILES = (50, 90, 99)
HEALTH_INTERVAL_S = 0.05


@dataclass(frozen=True)
class Workload:
    """What is sent: the endpoint path under the base URL and one streamed request body per request."""
    path: str
    bodies: list[dict]


def completion_workload(model: str, prompts: list[list[int]], output_len: int) -> Workload:
    return Workload("/v1/completions", [{"model": model, "prompt": p, "max_tokens": output_len} for p in prompts])


def chat_workload(model: str, messages: list[list[dict]], output_len: int) -> Workload:
    return Workload("/v1/chat/completions",
                    [{"model": model, "messages": m, "max_tokens": output_len} for m in messages])


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    error: str = ""


def _encoded(request: dict) -> bytes:
    """The streamed request's JSON, encoded before the run: serializing megabytes of data-URL images on the client's
    event loop mid-run would delay its own readings (TTFT, /health) by as long."""
    return json.dumps({**request, "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}, "return_token_ids": True}).encode()


async def _one_request(client: httpx.AsyncClient, url: str, body: bytes) -> RequestResult:
    start = last = time.perf_counter()
    result = RequestResult(ok=False)
    try:
        async with client.stream("POST", url, content=body, headers={"content-type": "application/json"}) \
                as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if not any(_carries_token(c) for c in chunk.get("choices") or ()):
                    continue
                now = time.perf_counter()
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.latency = time.perf_counter() - start
    result.ok = True
    return result


def _carries_token(choice: dict) -> bool:
    delta = choice.get("delta") or {}
    return bool(choice.get("text") or choice.get("token_ids") or delta.get("content")
                or delta.get("reasoning_content") or delta.get("tool_calls"))


async def _health_latencies(base_url: str, stop: asyncio.Event) -> list[float]:
    """Seconds each GET /health took, asked every HEALTH_INTERVAL_S on a connection of its own until stop."""
    latencies = []
    async with httpx.AsyncClient(timeout=None) as client:
        url = base_url.rstrip("/") + "/health"
        await client.get(url)
        while not stop.is_set():
            start = time.perf_counter()
            await client.get(url)
            latencies.append(time.perf_counter() - start)
            try:
                await asyncio.wait_for(stop.wait(), HEALTH_INTERVAL_S)
            except asyncio.TimeoutError:
                pass
    return latencies


async def _run(base_url: str, workload: Workload, request_rate: float, max_concurrency: int | None, seed: int,
               progress):
    url = base_url.rstrip("/") + workload.path
    bodies = [_encoded(body) for body in workload.bodies]
    count = len(bodies)
    gate = asyncio.Semaphore(max_concurrency or count)
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=max_concurrency or count)

    async def limited(client, body):
        async with gate:
            in_flight.change(+1)
            try:
                result = await _one_request(client, url, body)
            finally:
                in_flight.change(-1)
            progress()
            return result

    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        # the client's own first request (a connection, httpx's lazy imports) is not the server's first TTFT
        await client.get(base_url.rstrip("/") + "/v1/models")
        stop_health = asyncio.Event()
        health = asyncio.create_task(_health_latencies(base_url, stop_health))
        in_flight = Concurrency()
        start = time.perf_counter()
        tasks = []
        for body in bodies:
            tasks.append(asyncio.create_task(limited(client, body)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))  # Poisson arrivals
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        stop_health.set()
    return results, duration, in_flight, await health


class Concurrency:
    """Requests in flight over time: the most at once, and the time-weighted mean."""

    def __init__(self):
        self.now = self.peak = 0
        self.start = self.last = time.perf_counter()
        self.area = 0.0

    def change(self, by: int) -> None:
        t = time.perf_counter()
        self.area += self.now * (t - self.last)
        self.last, self.now = t, self.now + by
        self.peak = max(self.peak, self.now)

    def mean(self) -> float:
        return self.area / max(self.last - self.start, 1e-9)


def run_serving(base_url: str, workload: Workload, request_rate: float, max_concurrency: int | None, seed: int,
                progress=lambda: None) -> dict:
    results, duration, in_flight, health = asyncio.run(_run(base_url, workload, request_rate, max_concurrency, seed,
                                                            progress))
    summary = summarize(results, duration)
    summary["peak_concurrency"], summary["mean_concurrency"] = in_flight.peak, in_flight.mean()
    summary["health_requests"] = len(health)
    summary.update(_stats("health", health))
    summary["max_health_ms"] = max(health, default=0.0) * 1e3
    return summary


def _stats(name: str, values: list[float]) -> dict:
    ms = [v * 1e3 for v in values] or [0.0]
    ranked = sorted(ms)
    out = {f"mean_{name}_ms": statistics.fmean(ms), f"median_{name}_ms": statistics.median(ms)}
    for p in PERCENTILES[1:]:
        out[f"p{p}_{name}_ms"] = ranked[min(len(ranked) - 1, int(round(p / 100 * (len(ranked) - 1))))]
    return out


def summarize(results: list[RequestResult], duration: float) -> dict:
    done = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in done)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    summary = {"completed": len(done), "failed": len(results) - len(done), "duration_s": duration,
               "total_output_tokens": tokens, "request_throughput": len(done) / duration,
               "output_throughput": tokens / duration}
    summary.update(_stats("ttft", [r.ttft for r in done]))
    if results and results[0].ok:  # the first request sent: on a fresh server, any compile it waits for shows here
        summary["first_ttft_ms"] = results[0].ttft * 1e3
    summary.update(_stats("tpot", tpots))
    summary.update(_stats("itl", [x for r in done for x in r.itls]))
    summary.update(_stats("e2el", [r.latency for r in done]))
    errors = sorted({r.error for r in results if not r.ok})
    if errors:
        summary["errors"] = errors[:5]
    return summary


def format_summary(s: dict) -> list[str]:
    lines = [f"{'Successful requests:':<40}{s['completed']:>12}", f"{'Failed requests:':<40}{s['failed']:>12}",
             f"{'Benchmark duration (s):':<40}{s['duration_s']:>12.2f}",
             f"{'Total generated tokens:':<40}{s['total_output_tokens']:>12}",
             f"{'Request throughput (req/s):':<40}{s['request_throughput']:>12.2f}",
             f"{'Output token throughput (tok/s):':<40}{s['output_throughput']:>12.2f}"]
    if "peak_concurrency" in s:
        lines += [f"{'Peak concurrent requests:':<40}{s['peak_concurrency']:>12}",
                  f"{'Mean concurrent requests:':<40}{s['mean_concurrency']:>12.2f}"]
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency"),
                        ("health", "GET /health Latency (meanwhile)")):
        if f"mean_{name}_ms" not in s:
            continue
        lines.append(f"---{title}---")
        if name == "ttft" and "first_ttft_ms" in s:
            lines.append(f"{'First request TTFT (ms):':<40}{s['first_ttft_ms']:>12.2f}")
        lines.append(f"{'Mean ' + name.upper() + ' (ms):':<40}{s[f'mean_{name}_ms']:>12.2f}")
        lines.append(f"{'Median ' + name.upper() + ' (ms):':<40}{s[f'median_{name}_ms']:>12.2f}")
        for p in PERCENTILES[1:]:
            lines.append(f"{f'P{p} ' + name.upper() + ' (ms):':<40}{s[f'p{p}_{name}_ms']:>12.2f}")
        if name == "health":
            lines.append(f"{'Max HEALTH (ms):':<40}{s['max_health_ms']:>12.2f}")
    return lines + [f"error: {e}" for e in s.get("errors", [])]
