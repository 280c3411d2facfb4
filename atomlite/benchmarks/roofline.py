"""What a step must cost at best: bytes read per decode step over the copy bandwidth, FLOPs of a prefill over the
GEMM rate, both rates probed on the same device in the same process."""
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


def _experts_fraction(module, batch: int) -> float:
    """Share of a layer's experts a step reads when `batch` tokens each route to top_k of them (uniform routing)."""
    experts, top_k = module.num_experts, module.top_k
    return 1 - (1 - top_k / experts) ** batch


def _is_embedding(module) -> bool:
    return "Embedding" in type(module).__name__


def text_modules(model) -> list:
    """The model's modules but its vision tower's: a text token's prefill and decode never run the tower."""
    vision = getattr(model, "vision", None)
    tower = set(vision.modules()) if vision is not None else set()
    return [m for m in model.modules() if m not in tower]


def weight_bytes_read(model, batch: int) -> float:
    """Every weight of the text model once per step, routed experts by the share a batch touches, embedding tables
    not at all (a lookup reads a few rows); the tied lm_head is counted separately, in logits_bytes."""
    total = 0.0
    for module in text_modules(model):
        if _is_embedding(module):
            continue
        own = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
        total += own * (_experts_fraction(module, batch) if getattr(module, "routed_experts", False) else 1.0)
    return total


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
