"""The FP8 launches a compressed-tensors or Quark FP8 checkpoint of a Gemma 4 config adds: the fp8_linear GEMM of
every projection, for each activation semantics atomlite runs (dynamic per token with channel scales, dynamic
per group of 128 with 128x128 block scales, static per tensor, weight-only), with the platform's e4m3 weights
(e4m3fnuz on gfx942, as FP8Linear converts them at load)."""
import torch

from atomlite.quant.fp8 import FP8Spec

SPECS = (FP8Spec("channel", "token"), FP8Spec("block", "group"), FP8Spec("tensor", "static"),
         FP8Spec("channel", None))


def fp8_linears(r, projections: set[tuple[int, int]], meta) -> None:
    """r: the workload Recorder; projections: (N, K) of the model's Linears."""
    rows = r.step.tokens
    for spec in SPECS:
        for n, k in sorted(projections):
            columns = spec.scale_columns(k)
            shape = dict(n=n, k=k, weight=spec.weight, activation=spec.activation, block_k=spec.block_k,
                         group_size=spec.group_size)
            r.call("fp8_linear", shape, meta(rows, k), meta(n, k, dtype=r.platform.fp8_dtype),
                   meta(n, columns, dtype=torch.float32), meta(1, dtype=torch.float32), None, spec, method="matmul")


def fp8_moe_experts(r, hf: dict, meta) -> None:
    """The routed experts' two grouped GEMMs for each semantics (with the Triton activation between them)."""
    experts, top_k, tokens = hf["num_experts"], hf["top_k_experts"], r.step.tokens
    hidden, inner = hf["hidden_size"], hf["moe_intermediate_size"]
    routing = (meta(tokens, top_k, dtype=torch.float32), meta(tokens, top_k, dtype=torch.int64))
    for spec in SPECS:
        weights = {}
        for name, (rows, k) in {"gate_up_proj": (2 * inner, hidden), "down_proj": (hidden, inner)}.items():
            weights[name] = (meta(experts, rows, k, dtype=r.platform.fp8_dtype),
                             meta(experts, rows, spec.scale_columns(k), dtype=torch.float32),
                             meta(experts, dtype=torch.float32))
        shape = dict(experts=experts, dtype=torch.bfloat16, weight=spec.weight, activation=spec.activation,
                     block_k=spec.block_k, group_size=spec.group_size)
        r.call("fp8_moe_experts", shape, meta(tokens, hidden), weights, *routing, None, spec, method="experts")
