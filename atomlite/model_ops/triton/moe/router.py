"""The MoE router for one or two tokens (decode at batch 1-2) in one launch: the logits GEMM split over K, and the
program that finishes last adds the slices and picks each token's experts (softmax, top k, renormalization,
per-expert scales). Apart, that is a GEMM, a sum of its slices and a top-k launch, each waiting on the one before
(bench/router.py: 5.0 against 7.8 us at batch 1 on an H100)."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import dependent_launches, interpreting, pdl_launch, run_kernel
from atomlite.model_ops.triton.gemm import skinny as skinny_gemm
from atomlite.model_ops.triton.gemm.skinny import linear, split_k_tile
from atomlite.model_ops.triton.moe.tuning import ROUTER_MAX_ROWS as MAX_ROWS  # bench/router.py lifts it
from atomlite.model_ops.triton.moe.tuning import ROUTER_MAX_SPLITS, ROUTER_TOPK_WARPS, ROUTER_WARPS
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.moe import tuning
from atomlite.model_ops.triton.moe.routing import MAX_EXPERTS

BLOCK_N, BLOCK_K = skinny_gemm.DEFAULT_CONFIG.block_n, skinny_gemm.DEFAULT_CONFIG.block_k  # its tiles: split_k_tile


@triton.jit
def _store_top_k(s, experts, expert_scale, weights, ids, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_E: tl.constexpr):
    """One token's logits s [BLOCK_E] fp32 (-inf past the experts) -> its TOP_K weights and ids. Renormalized
    over the chosen k, the softmax over all experts is the softmax over the k alone: exp(s - max) / sum over k."""
    slots = tl.arange(0, BLOCK_K)
    chosen = tl.full([BLOCK_K], float("-inf"), dtype=tl.float32)
    chosen_ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for k in tl.static_range(TOP_K):  # the largest left, the lowest index among equals
        best = tl.max(s, 0)
        best_id = tl.min(tl.where(s == best, experts, BLOCK_E), 0)
        chosen = tl.where(slots == k, best, chosen)
        chosen_ids = tl.where(slots == k, best_id, chosen_ids)
        s = tl.where(experts == best_id, float("-inf"), s)
    used = slots < TOP_K
    e = tl.where(used, tl.exp(chosen - tl.max(chosen, 0)), 0.0)
    scale = tl.load(expert_scale + chosen_ids, mask=used, other=0.0).to(tl.float32)
    tl.store(weights + slots, e / tl.sum(e, 0) * scale, mask=used)
    tl.store(ids + slots, chosen_ids.to(tl.int64), mask=used)


@triton.jit
def _router_topk_kernel(scores, expert_scale, weights, ids, num_experts, stride_s,
                        TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr):
    row = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    s = tl.load(scores + row * stride_s + experts, mask=experts < num_experts, other=float("-inf")).to(tl.float32)
    _store_top_k(s, experts, expert_scale, weights + row * TOP_K, ids + row * TOP_K, TOP_K, BLOCK_K, BLOCK_E)


@triton.jit
def _router_kernel(x, w, expert_scale, part, arrivals, weights, ids, M, K, k_per_split, stride_xm, stride_wn,
                   NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, BLOCK_TOP: tl.constexpr, BLOCK_E: tl.constexpr,
                   SPLITS_P2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   UPCAST: tl.constexpr, PDL: tl.constexpr):
    """part [splits, M, NUM_EXPERTS] fp32: each program's slice of the logits. arrivals: a zero int32 the programs
    count themselves on; the last one resets it for the next launch. PDL: see split_k_tile (each program's one W
    tile loads while the norm ahead finishes)."""
    split = tl.program_id(1)
    acc, rows_m, rows_n = split_k_tile(x, w, M, K, k_per_split, stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K,
                                       UPCAST, PDL)
    tl.store(part + (split * M + rows_m[:, None]) * NUM_EXPERTS + rows_n[None, :], acc, mask=rows_m[:, None] < M)
    programs = tl.num_programs(0) * tl.num_programs(1)
    tl.debug_barrier()  # every lane's slice stored before the count below releases them
    # acq_rel: this program's slice is visible before it counts, and the last one sees every slice it counted
    if tl.atomic_add(arrivals, 1, sem="acq_rel") == programs - 1:
        tl.store(arrivals, 0)
        splits = tl.arange(0, SPLITS_P2)
        experts = tl.arange(0, BLOCK_E)
        live = (splits[:, None] < tl.num_programs(1)) & (experts[None, :] < NUM_EXPERTS)
        for m in range(M):
            slices = tl.load(part + (splits[:, None] * M + m) * NUM_EXPERTS + experts[None, :], mask=live,
                             other=0.0)
            logits = tl.sum(slices, 0).to(x.dtype.element_ty).to(tl.float32)  # rounded as the GEMM's output
            logits = tl.where(experts < NUM_EXPERTS, logits, float("-inf"))
            _store_top_k(logits, experts, expert_scale, weights + m * TOP_K, ids + m * TOP_K, TOP_K, BLOCK_TOP,
                         BLOCK_E)


def router_topk(scores: torch.Tensor, expert_scale: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as torch_ref.router_topk."""
    num_tokens, num_experts = scores.shape
    weights, ids = _empty_routing(num_tokens, top_k, scores.device)
    if num_tokens:
        if scores.stride(1) != 1:
            scores = scores.contiguous()
        run_kernel(_router_topk_kernel, (num_tokens,), scores, expert_scale, weights, ids, num_experts,
                   scores.stride(0), TOP_K=top_k, BLOCK_K=triton.next_power_of_2(top_k),
                   BLOCK_E=triton.next_power_of_2(num_experts), num_warps=ROUTER_TOPK_WARPS)
    return weights, ids


def _empty_routing(num_tokens: int, top_k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty((num_tokens, top_k), dtype=torch.float32, device=device),
            torch.empty((num_tokens, top_k), dtype=torch.int64, device=device))


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the one-launch router takes this call (else the GEMM and router_topk run apart): the skinny GEMM's
    shapes, up to MAX_ROWS tokens."""
    return x.shape[0] <= MAX_ROWS and skinny_gemm.fits(x, weight, skinny_gemm.DEFAULT_CONFIG)


_arrivals: dict[torch.device, torch.Tensor] = {}


def _arrival_counter(device: torch.device) -> torch.Tensor:
    """One zeroed counter per device, left at zero by every launch: launches run one after another on a stream."""
    if device not in _arrivals:
        _arrivals[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _arrivals[device]


def router(x: torch.Tensor, weight: torch.Tensor, expert_scale: torch.Tensor,
           top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as torch_ref.router: one launch for up to MAX_ROWS tokens, else linear + router_topk (one
    program per token)."""
    if not fits(x, weight):
        return router_topk(linear(x, weight), expert_scale, top_k)
    if x.stride(-1) != 1:
        x = x.contiguous()
    (m, k), num_experts = x.shape, weight.shape[0]
    k_tiles = k // BLOCK_K
    k_per_split = triton.cdiv(k_tiles, ROUTER_MAX_SPLITS) * BLOCK_K
    splits = triton.cdiv(k, k_per_split)
    part = torch.empty((splits, m, num_experts), dtype=torch.float32, device=x.device)
    weights, ids = _empty_routing(m, top_k, x.device)
    pdl = dependent_launches(x.device)
    run_kernel(_router_kernel, (num_experts // BLOCK_N, splits), x, weight, expert_scale, part,
               _arrival_counter(x.device), weights, ids, m, k, k_per_split, x.stride(0), weight.stride(0),
               NUM_EXPERTS=num_experts, TOP_K=top_k, BLOCK_TOP=triton.next_power_of_2(top_k),
               BLOCK_E=triton.next_power_of_2(num_experts), SPLITS_P2=triton.next_power_of_2(splits), BLOCK_M=16,
               BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, UPCAST=interpreting(), PDL=pdl, num_warps=ROUTER_WARPS,
               **pdl_launch(pdl))
    return weights, ids


def _refuses(platform, shape: dict) -> str | None:
    if shape.get("experts", 0) > MAX_EXPERTS:
        return f"{shape['experts']} experts exceed the router kernel's {MAX_EXPERTS} (one program holds a row)"
    return None


declare("router_topk", "triton", router_topk, refuses=_refuses, tuning=tuning)
declare("router", "triton", router, refuses=_refuses, tuning=tuning)  # the logits GEMM and router_topk in one launch
