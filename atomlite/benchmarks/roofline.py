"""What a step must cost at best: the larger of its FLOPs over the GEMM rate and the bytes it must move (the weights
it touches, the routed experts by routing, and its KV) over the copy bandwidth, both rates probed on the same device
in the same process. Decode steps are bound by their bytes; a prefill by its FLOPs, or by its bytes where a short
prompt touches nearly every expert of an MoE model."""
import contextlib
import statistics
import time
from dataclasses import dataclass

import torch

from atomlite.model_ops.kv_spec import KVSpec

COPY_BYTES = 2**30
GEMM_SIZE = 8192


def median_seconds(fn, device: torch.device, repeats: int) -> float:
    """fn's median time after one warm call: CUDA events on a GPU, perf_counter on the CPU."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class Probes:
    copy_bytes_per_s: float  # bytes read + bytes written per second by a large device-to-device copy
    gemm_flops_per_s: float  # dense matmul rate in the model's dtype

    def as_dict(self) -> dict:
        return {"copy_TBps": self.copy_bytes_per_s / 1e12, "gemm_TFLOPps": self.gemm_flops_per_s / 1e12}


def probe(device: torch.device, dtype: torch.dtype) -> Probes:
    small = device.type != "cuda"  # a CPU probe only needs to be representative, not to fill a GPU
    numel = (COPY_BYTES // (16 if small else 1)) // 4
    src = torch.rand(numel, device=device)
    dst = torch.empty_like(src)
    copy = median_seconds(lambda: dst.copy_(src), device, 5 if small else 20)
    n = GEMM_SIZE // (8 if small else 1)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    gemm = median_seconds(lambda: a @ b, device, 3 if small else 20)
    del src, dst, a, b
    return Probes(2 * numel * 4 / copy, 2 * n**3 / gemm)


def expected_experts(module, tokens: int) -> float:
    """Distinct experts of a layer that `tokens` tokens reach when each routes to top_k of num_experts uniformly:
    each expert is missed by a token with probability 1 - top_k / num_experts."""
    experts, top_k = module.num_experts, module.top_k
    return experts * (1 - (1 - top_k / experts) ** tokens)


def routed_layers(model) -> list:
    """The layers whose weights a step reads by routing (model_ops' experts layers declare `routed_experts`)."""
    return [m for m in text_modules(model) if getattr(m, "routed_experts", False)]


class RoutedExperts:
    """Counts the experts each routed layer reads, from the routing of the forwards run inside `counting()`: each
    call reads the distinct experts its topk_ids name. The ids are kept, not read back, until asked: the count adds
    no device work to the timed steps."""

    def __init__(self, model):
        self.layers = routed_layers(model)
        self._ids: dict[object, list] = {m: [] for m in self.layers}

    @contextlib.contextmanager
    def counting(self):
        hooks = [m.register_forward_pre_hook(self._record, with_kwargs=True) for m in self.layers]
        try:
            yield self
        finally:
            for hook in hooks:
                hook.remove()

    def _record(self, module, args, kwargs) -> None:
        self._ids[module].append(kwargs["topk_ids"] if "topk_ids" in kwargs else args[2])

    def reads(self) -> dict:
        """Per layer, the experts read summed over its calls (a layer called once per step: over the steps)."""
        return {m: sum(int(ids.unique().numel()) for ids in calls) for m, calls in self._ids.items()}

    def touched(self, module) -> set[int]:
        return {int(i) for ids in self._ids[module] for i in ids.flatten().tolist()}

    def clear(self) -> None:
        for calls in self._ids.values():
            calls.clear()


def _is_embedding(module) -> bool:
    return "Embedding" in type(module).__name__


def text_modules(model) -> list:
    """The model's modules but its vision tower's: a text token's prefill and decode never run the tower."""
    vision = getattr(model, "vision", None)
    tower = set(vision.modules()) if vision is not None else set()
    return [m for m in model.modules() if m not in tower]


def weight_bytes(model, steps: int, experts_read: dict) -> float:
    """Every weight of the text model once per step, a routed layer's by the experts it read (experts_read: layer ->
    experts read over the steps), embedding tables not at all (a lookup reads a few rows); the tied lm_head is
    counted separately, in logits_bytes."""
    total = 0.0
    for module in text_modules(model):
        if _is_embedding(module):
            continue
        own = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
        routed = getattr(module, "routed_experts", False)
        total += own * experts_read[module] / module.num_experts if routed else own * steps
    return total


def expected_reads(model, step_tokens: list[int]) -> dict:
    """Per routed layer, the experts steps of these token counts read under uniform routing."""
    return {m: sum(expected_experts(m, tokens) for tokens in step_tokens) for m in routed_layers(model)}


def weight_bytes_read(model, batch: int) -> float:
    """The weights one step of `batch` tokens reads, the experts as uniform routing touches them."""
    return weight_bytes(model, 1, expected_reads(model, [batch]))


def logits_bytes(model) -> float:
    hf = model.spec.hf
    return hf["vocab_size"] * hf["hidden_size"] * model.logits_weight.element_size()


def kv_bytes_read(specs: list[KVSpec], batch: int, context: int) -> float:
    """K and V each decode step reads: every layer (KV-sharing ones read their target's) sees min(context, window)
    keys of each sequence."""
    total = 0
    for spec in specs:
        owner = specs[spec.target] if spec.kind == "shared" else spec
        visible = min(context, owner.window) if owner.kind == "sliding" else context
        total += batch * visible * owner.bytes_per_token
    return total


def decode_step_bytes(model, specs: list[KVSpec], batch: int, context: int) -> dict:
    weights = weight_bytes_read(model, batch) + logits_bytes(model)
    kv = kv_bytes_read(specs, batch, context)
    return {"weights": weights, "kv": kv, "total": weights + kv}


def _matmul_params_per_token(model) -> float:
    total = 0.0
    for module in text_modules(model):
        if hasattr(module, "in_features") and hasattr(module, "out_features"):
            total += module.in_features * module.out_features
        elif getattr(module, "routed_experts", False):
            total += module.top_k * module.params_per_expert
    return total


def prefill_flops(model, prompt_len: int) -> float:
    """Linear layers (2 FLOPs per weight per token), attention scores and values over each query's visible keys,
    and the logits of the last token."""
    flops = 2 * prompt_len * _matmul_params_per_token(model)
    for attn in model.attention_layers():
        window = attn.window or prompt_len
        visible = sum(min(i + 1, window) for i in range(prompt_len))
        flops += 4 * visible * attn.num_heads * attn.head_dim
    hf = model.spec.hf
    return flops + 2 * hf["vocab_size"] * hf["hidden_size"]


def prefill_kv_bytes(specs: list[KVSpec], tokens: int) -> float:
    """K and V a prompt of `tokens` tokens moves at least: each layer that owns a cache writes every token's K/V
    once, and each layer's attention reads every key once (its own or its target's)."""
    total = 0
    for spec in specs:
        owner = specs[spec.target] if spec.kind == "shared" else spec
        total += tokens * owner.bytes_per_token * (1 if spec.kind == "shared" else 2)
    return total


def chunk_tokens(tokens: int, budget: int) -> list[int]:
    """The tokens of each step that prefills `tokens` under a per-step budget of `budget` tokens."""
    full, rest = divmod(tokens, budget)
    return [budget] * full + ([rest] if rest else [])


def prefill_step_bytes(model, specs: list[KVSpec], prompt_len: int, budget: int,
                       experts_read: dict | None = None) -> dict:
    """What one prompt's prefill reads and writes: the weights once per chunk (the routed experts counted from the
    routing where experts_read is given, else expected for uniform routing), the lm_head once, and its KV."""
    chunks = chunk_tokens(prompt_len, budget)
    reads = experts_read if experts_read is not None else expected_reads(model, chunks)
    weights = weight_bytes(model, len(chunks), reads) + logits_bytes(model)
    kv = prefill_kv_bytes(specs, prompt_len)
    return {"weights": weights, "kv": kv, "total": weights + kv}


def bound(flops: float, nbytes: float, probes: Probes) -> tuple[float, str]:
    """The roofline of work of `flops` FLOPs and `nbytes` bytes: seconds, and which of the two binds."""
    compute, memory = flops / probes.gemm_flops_per_s, nbytes / probes.copy_bytes_per_s
    return (compute, "FLOPs") if compute >= memory else (memory, "bytes")


def packed_prefill_seconds(model, specs: list[KVSpec], probes: Probes, num_prompts: int, prompt_len: int,
                           budget: int) -> float:
    """The prompts prefilled back to back in steps of `budget` tokens, each step at the larger of its share of the
    FLOPs and its bytes (the weights its tokens touch, experts by uniform routing, the lm_head, its tokens' KV)."""
    per_token_flops = prefill_flops(model, prompt_len) / prompt_len
    seconds = 0.0
    for tokens in chunk_tokens(num_prompts * prompt_len, budget):
        nbytes = weight_bytes_read(model, tokens) + logits_bytes(model) + prefill_kv_bytes(specs, tokens)
        seconds += bound(tokens * per_token_flops, nbytes, probes)[0]
    return seconds


def prefill_roofline(model, specs: list[KVSpec], probes: Probes, prompt_len: int, budget: int,
                     experts_read: dict | None = None) -> tuple[float, str, dict]:
    """One prompt's prefill at the larger of its FLOPs and its bytes (prefill_step_bytes): seconds, the words that
    say so, and the figures for a JSON row."""
    nbytes = prefill_step_bytes(model, specs, prompt_len, budget, experts_read)
    flops = prefill_flops(model, prompt_len)
    seconds, binding = bound(flops, nbytes["total"], probes)
    experts = "" if not routed_layers(model) else (" (experts as routed)" if experts_read is not None else
                                                    " (experts by uniform routing)")
    what = (f"the larger of {flops / 1e12:.2f} TFLOP at the probed GEMM rate and {nbytes['weights'] / 1e9:.2f} GB "
            f"weights{experts} + {nbytes['kv'] / 1e9:.3f} GB KV at the probed copy bandwidth: {binding}")
    return seconds, what, {"flops": flops, "bytes": nbytes["total"], "bound_by": binding}
