"""Prometheus metrics for /metrics, on a registry of the app's own (several apps in one process stay apart)."""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.running = Gauge("atomlite:num_requests_running", "Requests in the running batch", registry=r)
        self.waiting = Gauge("atomlite:num_requests_waiting", "Requests waiting to be scheduled", registry=r)
        self.kv_used = Gauge("atomlite:kv_blocks_used", "KV blocks in use", ["group", "kind"], registry=r)
        self.kv_total = Gauge("atomlite:kv_blocks_total", "KV blocks in the pool", ["group", "kind"], registry=r)
        self.prompt_tokens = Counter("atomlite:prompt_tokens", "Prompt tokens received", registry=r)
        self.generation_tokens = Counter("atomlite:generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("atomlite:time_to_first_token_seconds", "Arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("atomlite:inter_token_latency_seconds", "Time between tokens of a request",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.finished = Counter("atomlite:request_finished", "Finished requests by reason", ["reason"], registry=r)

    def update_engine(self, running: int, waiting: int, kv_usage) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        for i, (spec, used, total) in enumerate(kv_usage):
            self.kv_used.labels(group=str(i), kind=spec.kind).set(used)
            self.kv_total.labels(group=str(i), kind=spec.kind).set(total)

    def render(self) -> bytes:
        return generate_latest(self.registry)
