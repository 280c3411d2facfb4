"""Gemma 4's decoder layer and its sublayers: attention, the MLP, the MoE router (shared/docs/GEMMA4.md).

Each forward reads as the math; which kernel computes what, and in which form one layer's output reaches the next,
is decided once by model_ops.fusion.link from the dataflow each layer declares.
"""
import torch
from torch import nn

from atomlite.distributed import Shard, TensorParallel, kv_heads_of_rank, split
from atomlite.model_ops import dispatch
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.branches import overlaps, side_by_side
from atomlite.model_ops.carriers import as_heads, merged_heads, split_columns
from atomlite.model_ops.context import ForwardContext
from atomlite.model_ops.fusion import Feeds, NormedSum
from atomlite.model_ops.linear import Linear, copy_weight
from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.model_ops.mlp import GatedGeluMLP
from atomlite.model_ops.norm import Residual, RMSNorm
from atomlite.model_ops.rope import RotaryEmbedding
from atomlite.model_ops.sharding import reduced


def attention_heads_of_rank(cfg: dict, layer, tp: TensorParallel) -> tuple[Shard, Shard]:
    """The query heads and KV heads a rank keeps (distributed.kv_heads_of_rank: KV heads replicated where fewer
    than the ranks)."""
    heads = split(cfg["num_attention_heads"], tp.rank, tp.size, "num_attention_heads")
    kv_key = "num_global_key_value_heads" if layer.kind == "full" and layer.k_eq_v else "num_key_value_heads"
    kv_heads = kv_heads_of_rank(layer.num_kv_heads, cfg["num_attention_heads"], tp.rank, tp.size, kv_key)
    return heads, kv_heads


class Gemma4Attention(nn.Module):
    """owner_key_norm: for a KV-sharing layer whose owner's cache holds V alone (k_from_v, with key_rope the
    owner's RoPE), the owner's k_norm, whose weight rebuilds K. bidirectional_spans: the queries of an image's soft
    tokens see the whole image (ForwardContext.key_ends)."""

    def __init__(self, cfg: dict, layer, window: int | None, shares_kv: bool, lin: LinearBuilder, prefix: str,
                 key_rope: RotaryEmbedding | None = None, owner_key_norm: RMSNorm | None = None,
                 bidirectional_spans: bool = False):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.head_dim = layer.head_dim
        heads, kv_heads = attention_heads_of_rank(cfg, layer, lin.tp)
        self.num_kv_heads = kv_heads.size
        # One GEMM for q, k and v (no v on k_eq_v layers: V comes from raw k; q alone on KV-sharing layers), unless
        # the checkpoint quantizes them differently: then one projection each. Each holds this rank's heads.
        kv_rows = kv_heads.scaled(self.head_dim)
        kv_parts = [] if shares_kv else [kv_rows] if layer.k_eq_v else [kv_rows, kv_rows]
        qkv_rows = [heads.scaled(self.head_dim)] + kv_parts
        self.qkv_sizes = [rows.size for rows in qkv_rows]
        self.qkv_names = ["q_proj", "k_proj", "v_proj"][:len(self.qkv_sizes)]
        parts = [f"{prefix}.{name}" for name in self.qkv_names]
        self.fused_qkv = lin.can_fuse(parts)
        if self.fused_qkv:
            self.qkv_proj = lin.merged(f"{prefix}.qkv_proj", hidden, [r.total for r in qkv_rows], parts, qkv_rows)
        else:
            for name, rows in zip(self.qkv_names, qkv_rows):
                setattr(self, name, lin.linear(f"{prefix}.{name}", hidden, rows.total, rows))
        self.q_norm = RMSNorm(self.head_dim, eps)
        if not shares_kv:
            self.k_norm = RMSNorm(self.head_dim, eps)
        self.shares_kv = shares_kv
        # out of the module tree: the owner's model holds and loads it
        self.owner_key_norms = () if owner_key_norm is None else (owner_key_norm,)
        self.o_proj = lin.row_parallel(f"{prefix}.o_proj", heads.scaled(self.head_dim), hidden)
        self.attn = Attention(heads.size, kv_heads.size, self.head_dim, scale=1.0, window=window, key_rope=key_rope,
                              bidirectional_spans=bidirectional_spans)

    @property
    def input_linear(self) -> nn.Module | None:
        """The one linear that reads this sublayer's input (None with separate q/k/v projections)."""
        return self.qkv_proj if self.fused_qkv else None

    def dataflow(self):
        if self.fused_qkv:
            yield Feeds(self.qkv_proj, self.attn)
        yield Feeds(self.attn, self.o_proj)

    def forward(self, x, cos, sin, ctx: ForwardContext):
        """x: the normed input."""
        if self.fused_qkv:
            parts = split_columns(self.qkv_proj(x), self.qkv_sizes)
        else:
            parts = [getattr(self, name)(x) for name in self.qkv_names]
        q, k, v, k_weight = as_heads(parts[0], self.head_dim), None, None, None
        if not self.shares_kv:  # V is v_norm of the raw k projection on k_eq_v layers (parts[-1] is k then)
            k, v, k_weight = (as_heads(parts[1], self.head_dim), as_heads(parts[-1], self.head_dim),
                              self.k_norm.weight)
        elif self.owner_key_norms:
            k_weight = self.owner_key_norms[0].weight
        out = self.attn.forward_raw(q, k, v, self.q_norm.weight, k_weight, self.q_norm.eps, cos, sin, ctx)
        return self.o_proj(merged_heads(out))


class Gemma4Router(nn.Module):
    """norm(x) * scale * hidden^-0.5 -> proj -> the top-k experts (router_topk). The weightless norm and the two
    scalings are one norm whose weight is scale * hidden^-0.5 (made after loading)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, eps: float, lin: LinearBuilder, prefix: str):
        super().__init__()
        self.proj = lin.linear(f"{prefix}.proj", hidden, num_experts)
        self.scale = nn.Parameter(torch.empty(hidden), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.empty(num_experts), requires_grad=False)
        self.scale.weight_loader = self.per_expert_scale.weight_loader = copy_weight
        self.top_k, self.root_size = top_k, hidden ** -0.5
        self.norm = RMSNorm(hidden, eps, learned=False)
        self._topk = dispatch.choose("router_topk", experts=num_experts).fn
        # a plain bf16/fp16 projection goes into the one-launch router with the top-k; a quantized one runs apart
        self._route = dispatch.choose("router", experts=num_experts).fn if type(self.proj) is Linear else None

    def process_after_loading(self) -> None:
        self.norm.weight = (self.scale.float() * self.root_size).to(self.scale.dtype)

    def forward(self, h: Residual):
        """h: the residual stream this layer's feed-forward reads (its norm may come with it, Residual)."""
        normed = h.normed(self.norm)
        if self._route is not None:
            return self._route(normed, self.proj.weight, self.per_expert_scale, self.top_k)
        return self._topk(self.proj(normed), self.per_expert_scale, self.top_k)


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: dict, layer, window, shares_kv: bool, lin: LinearBuilder, prefix: str,
                 key_rope: RotaryEmbedding | None = None, owner_key_norm: RMSNorm | None = None,
                 bidirectional_spans: bool = False):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = Gemma4Attention(cfg, layer, window, shares_kv, lin, f"{prefix}.self_attn", key_rope,
                                         owner_key_norm, bidirectional_spans)
        wide = 2 if cfg.get("use_double_wide_mlp") and shares_kv else 1
        self.mlp = GatedGeluMLP(hidden, cfg["intermediate_size"] * wide, lin, f"{prefix}.mlp")
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(hidden, eps))
        self.layer_scalar = nn.Parameter(torch.empty(1), requires_grad=False)
        self.layer_scalar.weight_loader = copy_weight
        self.moe = bool(cfg.get("enable_moe_block"))
        if self.moe:
            self.router = Gemma4Router(hidden, cfg["num_experts"], cfg["top_k_experts"], eps, lin, f"{prefix}.router")
            self.experts = lin.experts(f"{prefix}.experts", cfg["num_experts"], hidden, cfg["moe_intermediate_size"])
            self.experts.top_k = cfg["top_k_experts"]
            self.tp = lin.tp
            if self.tp.size > 1:  # the two branches' partial sums are all-reduced together (_moe_feed_forward)
                self.experts.reduce_output = self.mlp.down_proj.reduce_output = False
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                         "pre_feedforward_layernorm_2"):
                setattr(self, name, RMSNorm(hidden, eps))
        self.ple_dim = cfg.get("hidden_size_per_layer_input") or 0
        if self.ple_dim:
            self.per_layer_input_gate = lin.linear(f"{prefix}.per_layer_input_gate", hidden, self.ple_dim)
            self.ple_act = nn.GELU(approximate="tanh")
            self.per_layer_projection = lin.linear(f"{prefix}.per_layer_projection", self.ple_dim, hidden)
            self.post_per_layer_input_norm = RMSNorm(hidden, eps)

    def dataflow(self, next_norm: RMSNorm, next_reader: nn.Module | None):
        """What reads what (model_ops.fusion). next_norm is applied to this layer's output next (the next layer's
        input norm, or the final norm); next_reader, where one linear alone does, reads that."""
        yield from self.self_attn.dataflow()
        yield from self.mlp.dataflow()
        yield Feeds(self.self_attn.o_proj, self.post_attention_layernorm)
        feed_forward_inputs = (self.pre_feedforward_layernorm,)
        if self.moe:
            feed_forward_inputs += (self.router.norm, self.pre_feedforward_layernorm_2)
        yield NormedSum(self.post_attention_layernorm, feed_forward_inputs, self.mlp.gate_up_proj,
                        self.experts if self.moe else None)
        yield Feeds(self.mlp.down_proj, self.post_feedforward_layernorm)
        if self.moe:  # both branches reach the update through post_feedforward_layernorm_1.joined
            yield Feeds(self.experts, self.post_feedforward_layernorm)
            yield Feeds(self.post_feedforward_layernorm_1, self.post_feedforward_layernorm)
        if not self.ple_dim:  # with per-layer inputs, h changes between the update and next_norm
            yield NormedSum(self.post_feedforward_layernorm, (next_norm,), next_reader)

    def forward(self, h: Residual, ple, cos, sin, ctx) -> Residual:
        """h: the residual stream, in and out, with the norms of it that its last update computed (Residual)."""
        attn = self.self_attn(h.normed(self.input_layernorm), cos, sin, ctx)
        h = self.post_attention_layernorm.add_to_residual(attn, h.stream)
        m = self._moe_feed_forward(h) if self.moe else self.mlp(h.normed(self.pre_feedforward_layernorm))
        if not self.ple_dim:
            return self.post_feedforward_layernorm.add_to_residual(m, h.stream, scale=self.layer_scalar)
        h = self.post_feedforward_layernorm.add_to_residual(m, h.stream).stream
        gated = self.ple_act(self.per_layer_input_gate(h)) * ple
        return Residual((h + self.post_per_layer_input_norm(self.per_layer_projection(gated))) * self.layer_scalar)

    def _moe_feed_forward(self, h: Residual):
        x, experts_in = h.normed(self.pre_feedforward_layernorm), h.normed(self.pre_feedforward_layernorm_2)
        # At decode the router is latency-bound: beside the MLP's weight stream its loads queue behind the MLP's
        # (measured 11.8 against 5 us alone), and the experts wait for it; so it runs first, alone. The experts'
        # chain of launches (gate_up, then down) then overlaps the MLP, which only streams weights; at prefill
        # the experts' weight reads overlap the MLP's multiplies (branches.overlaps).
        route = self.router(h)
        stream = h.stream
        experts, m = side_by_side(lambda: self.experts(experts_in, *route), lambda: self.mlp(x), stream.device,
                                  overlap=overlaps(stream.shape[0]))
        if self.tp.size > 1:  # one collective for both, on this stream, after the side stream has joined it
            m, experts = reduced(self.tp, m, experts, hand_over=self._hands_rank_partials())
        return self.post_feedforward_layernorm_1.joined(m, self.post_feedforward_layernorm_2, experts)

    def _hands_rank_partials(self) -> bool:
        """Whether the branches' shares go to the residual update as RankPartials (summed in its kernel): linked so,
        both, and joined there."""
        return (self.experts.hands_rank_partials and self.mlp.down_proj.hands_rank_partials
                and self.post_feedforward_layernorm_1.joins_lazily)


def decoder_dataflow(layers: nn.ModuleList, final_norm: RMSNorm):
    """A stack's edges (model_ops.fusion): each layer's output goes on to the next layer's input norm, read by that
    layer's fused q/k/v projection where it has one, and the last layer's to the final norm."""
    following = [(layer.input_layernorm, layer.self_attn.input_linear) for layer in layers[1:]]
    for layer, (next_norm, next_reader) in zip(layers, following + [(final_norm, None)]):
        yield from layer.dataflow(next_norm, next_reader)
