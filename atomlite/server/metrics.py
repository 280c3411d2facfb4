"""Prometheus metrics for /metrics, on a registry of the app's own (several apps in one process stay apart). Names
follow vLLM's (`vllm:` becomes `atomlite:`) where vLLM has the same series."""
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class ServerMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.running = Gauge("atomlite:num_requests_running", "Requests in the running batch", registry=r)
        self.waiting = Gauge("atomlite:num_requests_waiting", "Requests waiting to be scheduled", registry=r)
        self.kv_used = Gauge("atomlite:kv_blocks_used", "KV blocks in use", ["group", "kind"], registry=r)
        self.kv_total = Gauge("atomlite:kv_blocks_total", "KV blocks in the pool", ["group", "kind"], registry=r)
        self.prompt_tokens = Counter("atomlite:prompt_tokens", "Prompt tokens received", registry=r)
        self.generation_tokens = Counter("atomlite:generation_tokens", "Tokens generated", registry=r)
        self.preemptions = Counter("atomlite:num_preemptions", "Sequences preempted (their KV recomputed later)",
                                   registry=r)
        self.prefix_queries = Counter("atomlite:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      registry=r)
        self.prefix_hits = Counter("atomlite:prefix_cache_hits", "Prompt tokens found in the prefix cache",
                                   registry=r)
        self.iteration_tokens = Histogram("atomlite:iteration_tokens_total", "Tokens in one forward pass",
                                          buckets=TOKEN_BUCKETS, registry=r)
        self.ttft = Histogram("atomlite:time_to_first_token_seconds", "Arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("atomlite:inter_token_latency_seconds", "Time between tokens of a request",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e_latency = Histogram("atomlite:e2e_request_latency_seconds", "Arrival to the last token",
                                     buckets=REQUEST_BUCKETS, registry=r)
        self.queue_time = Histogram("atomlite:request_queue_time_seconds", "Time waiting before first scheduled",
                                    buckets=REQUEST_BUCKETS, registry=r)
        self.prefill_time = Histogram("atomlite:request_prefill_time_seconds",
                                      "First scheduled to first token", buckets=REQUEST_BUCKETS, registry=r)
        self.decode_time = Histogram("atomlite:request_decode_time_seconds", "First token to last token",
                                     buckets=REQUEST_BUCKETS, registry=r)
        self.forward_passes = Counter("atomlite:forward_passes", "Forward passes by how they ran: replayed from a "
                                      "captured decode graph, or eager", ["path"], registry=r)
        self.finished = Counter("atomlite:request_finished", "Finished requests by reason", ["reason"], registry=r)
        self.spec_drafts = Counter("atomlite:spec_decode_num_drafts", "Draft rounds verified (speculative decoding)",
                                   registry=r)
        self.spec_draft_tokens = Counter("atomlite:spec_decode_num_draft_tokens", "Draft tokens proposed",
                                         registry=r)
        self.spec_accepted = Counter("atomlite:spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                     registry=r)
        self.lora_info = Gauge("atomlite:lora_requests_info", "LoRA adapters of the running and waiting requests "
                               "(comma-separated names; the value is when it was set)",
                               ["max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=r)
        self.spec_accepted_per_pos = Counter("atomlite:spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted, by position in the draft", ["position"],
                                             registry=r)

    def update_engine(self, stats, previous) -> None:
        """The engine's gauges, its totals' growth since `previous` (None at first) and its forward passes."""
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        for i, (kind, used, total) in enumerate(stats.kv_usage):
            self.kv_used.labels(group=str(i), kind=kind).set(used)
            self.kv_total.labels(group=str(i), kind=kind).set(total)
        for counter, name in ((self.preemptions, "num_preemptions"), (self.prefix_queries, "prefix_cache_queries"),
                              (self.prefix_hits, "prefix_cache_hits")):
            counter.inc(getattr(stats, name) - (getattr(previous, name) if previous is not None else 0))
        for path, count in stats.forward_passes.items():
            before = previous.forward_passes.get(path, 0) if previous is not None else 0
            self.forward_passes.labels(path=path).inc(count - before)
        for tokens in stats.iteration_tokens:
            self.iteration_tokens.observe(tokens)
        if stats.spec is not None:
            self._update_spec(stats.spec, getattr(previous, "spec", None))
        if stats.lora is not None:
            slots, running, waiting = stats.lora
            self.lora_info.clear()
            self.lora_info.labels(max_lora=str(slots), running_lora_adapters=",".join(running),
                                  waiting_lora_adapters=",".join(waiting)).set(time.time())

    def _update_spec(self, spec, previous) -> None:
        for counter, name in ((self.spec_drafts, "num_drafts"), (self.spec_draft_tokens, "num_draft_tokens"),
                              (self.spec_accepted, "num_accepted_tokens")):
            counter.inc(getattr(spec, name) - (getattr(previous, name) if previous is not None else 0))
        for position, accepted in enumerate(spec.accepted_per_pos):
            before = previous.accepted_per_pos[position] if previous is not None else 0
            self.spec_accepted_per_pos.labels(position=str(position)).inc(accepted - before)

    def render(self) -> bytes:
        return generate_latest(self.registry)
