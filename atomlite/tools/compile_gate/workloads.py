"""The kernel launches atomlite makes for a Gemma 4 config on a platform: every op the dispatch table gives to
Triton is called on meta tensors at the engine's default batch shapes, and the launchers' launches are recorded
(common.recording), so the gate compiles what the launchers decide, nothing restated here.

Weights are MXFP4 as a Quark W4A4 export of the config would store them (the example configs are bf16; the MXFP4
launches are what such a checkpoint adds): dynamic activation quantization, scales within the fast expansion's
range (wide_scales False) and the lookup kernel's (lookup_scales True), as real weights have them (SCALES).
"""
from dataclasses import dataclass
from pathlib import Path

import torch

from atomlite.config import LayerAttention, ModelSpec, load_model_spec
from atomlite.engine.encoder_cache import MAX_SOFT_TOKENS
from atomlite.model_ops import dispatch, triton as triton_ops
from atomlite.model_ops.carriers import NormedPair, PartialSums, RankPartials, as_heads, split_columns
from atomlite.model_ops.context import HostBatch
from atomlite.model_ops.k_from_v import KFromV, rotary_pairs
from atomlite.model_ops.packed import PackedSequences
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.rope import inv_freq_from_params
from atomlite.model_ops.peer_memory import MAX_BYTES as PEER_MAX_BYTES, PeerChannel
from atomlite.model_ops.triton.all_reduce import MAX_PROGRAMS, one_shot_all_reduce
from atomlite.model_ops.triton.common import KernelLaunch, recording
from atomlite.tools.compile_gate.fp8_workloads import fp8_linears, fp8_moe_experts
from atomlite.model_ops.triton.mxfp4.family import ScaleFacts
from atomlite.model_ops.triton.mxfp4.gemm import K_ALIGN, gated_path, input_quantization
from atomlite.model_ops.triton.gemm.skinny import MAX_ROWS as SKINNY_MAX_ROWS

EXAMPLE_CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"
GEMMA4_CONFIGS = ("gemma-4-31B-it", "gemma-4-26B-A4B-it", "gemma-4-E2B-it")
BLOCK_SIZE = 16  # the engine's default --block-size
NUM_BLOCKS = 4096
SPLIT_K_SLICES = 4  # the most K splits a decode projection makes (pick_config's)
SCALES = ScaleFacts(wide_scales=False, lookup_scales=True)

# The sm_90 block-scaled path multiplies by cuBLAS (torch's scaled_mm), which has no meta kernel: the gate needs
# only the Triton launches around it, so on meta the GEMM just hands back its output.
_META_GEMMS = torch.library.Library("aten", "IMPL", "Meta")
_META_GEMMS.impl("_scaled_mm_v2.out", lambda *args, out, **kwargs: out)


@dataclass(frozen=True)
class Step:
    """One engine step: num_seqs sequences, each with `new` tokens computed and `context` tokens in its cache."""
    name: str
    num_seqs: int
    new: int
    context: int

    @property
    def tokens(self) -> int:
        return self.num_seqs * self.new

    def host(self) -> HostBatch:
        """The lengths as the model runner gives them to the layers."""
        return HostBatch.of([i * self.new for i in range(self.num_seqs + 1)], [self.context] * self.num_seqs)


# A chunked prefill at the default --max-num-batched-tokens 2048, and decode of one sequence (split-KV) and of
# --max-num-seqs 64 sequences.
STEPS = (Step("prefill", 4, 512, 2048), Step("decode-1", 1, 1, 8192), Step("decode-64", 64, 1, 4096))


def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@dataclass
class Recorder:
    """Calls ops as the model would and keeps each launch with the workload that made it."""
    platform: Platform
    model: str
    step: Step
    launches: list[tuple[str, KernelLaunch]]

    def call(self, op: str, shape: dict, *args, method: str | None = None, **kwargs) -> None:
        """method: which call of an MXFP4 op's family object (its ops-table entry) to make."""
        choice = dispatch.choose(op, self.platform, **shape)
        if choice.fn is not triton_ops.OPS[op]:  # another backend's kernel: nothing for the gate to compile
            return
        label = f"{self.model} {self.step.name} {op}[{','.join(f'{k}={v}' for k, v in shape.items())}]"
        with recording(self.platform) as launches:
            (choice.fn if method is None else getattr(choice.fn, method))(*args, **kwargs)
        self.launches += [(label, launch) for launch in launches]

    def record(self, label: str, launcher, *args) -> None:
        """A launcher outside the dispatch table (the tensor-parallel all-reduce), called as the engine calls it."""
        with recording(self.platform) as launches:
            launcher(*args)
        self.launches += [(f"{self.model} {self.step.name} {label}", launch) for launch in launches]


def _tensor_parallel_all_reduce(r: Recorder, hidden: int) -> None:
    """The one-shot all-reduce of a decode step's [tokens, hidden] rows, at 2 and 8 ranks, and the residual updates
    that sum RankPartials (one branch; an MoE layer's pair) where one exchange holds the rows."""
    numel = r.step.tokens * hidden
    if numel * 2 > PEER_MAX_BYTES:
        return  # a prefill's rows go through the collective library
    x, weight = meta(r.step.tokens, hidden), meta(hidden)
    for world in (2, 8):
        addresses = meta(world, dtype=torch.int64), meta(world, dtype=torch.int64)
        epochs = meta(MAX_PROGRAMS, dtype=torch.int64)
        r.record(f"one_shot_all_reduce[world={world}]", one_shot_all_reduce, meta(numel), *addresses, epochs,
                 PEER_MAX_BYTES // 2, 0, world)
        channel = PeerChannel(*addresses, epochs, 0, world)
        if channel.holds(r.step.tokens, hidden, x.element_size()):
            share = RankPartials(x, channel)
            r.call("rms_norm_residual", dict(dim=hidden), share, x, weight, 1e-6, None, weight)
            r.call("rms_norm_residual", dict(dim=hidden), NormedPair(share, share, weight, weight), x, weight, 1e-6,
                   meta(1), weight)


def _attention_layer(r: Recorder, spec: ModelSpec, layer: LayerAttention, window: int | None,
                     bidirectional_spans: bool = False) -> None:
    step, heads, dim, kv_heads = r.step, spec.hf["num_attention_heads"], layer.head_dim, layer.num_kv_heads
    q, k = meta(step.tokens, heads, dim), meta(step.tokens, kv_heads, dim)
    cos, weight, slots = meta(step.tokens, dim), meta(dim), meta(step.tokens, dtype=torch.int64)
    cache = meta(NUM_BLOCKS, BLOCK_SIZE, kv_heads, dim)
    # q/k norms, RoPE, v norm and the KV write of a layer (one launch), and of a KV-sharing layer (q alone)
    r.call("qk_norm_rope", dict(head_dim=dim), q, k, k, weight, weight, 1e-6, cos, cos, cache, cache, slots)
    r.call("qk_norm_rope", dict(head_dim=dim), q, None, None, weight, None, 1e-6, cos, cos)
    if step.tokens <= SKINNY_MAX_ROWS:  # a decode step's QKV projection hands its split-K slices to the prepare
        slices = PartialSums(meta(SPLIT_K_SLICES, step.tokens, (heads + 2 * kv_heads) * dim, dtype=torch.float32),
                             torch.bfloat16)
        sizes = [heads * dim, kv_heads * dim, kv_heads * dim]
        q_s, k_s, v_s = (as_heads(p, dim) for p in split_columns(slices, sizes))
        r.call("qk_norm_rope", dict(head_dim=dim), q_s, k_s, v_s, weight, weight, 1e-6, cos, cos, cache, cache, slots)
    int32 = dict(dtype=torch.int32)
    table = meta(step.num_seqs, -(-step.context // BLOCK_SIZE), **int32)
    shape = dict(head_dim=dim, window=window is not None, gqa=heads // kv_heads)
    r.call("attention", shape, q, cache, cache, table, meta(step.num_seqs, **int32),
           meta(step.num_seqs + 1, **int32), 1.0, window)
    form = _input_form(r, spec.hf["hidden_size"], heads * dim)  # o_proj's
    if form is not None:  # the split-KV merge writes the output quantized for an MXFP4 o_proj
        r.call("attention", shape, q, cache, cache, table, meta(step.num_seqs, **int32),
               meta(step.num_seqs + 1, **int32), 1.0, window, quantize=form)
    fp8_cache = meta(NUM_BLOCKS, BLOCK_SIZE, kv_heads, dim, dtype=r.platform.fp8_dtype)  # --kv-cache-dtype fp8
    r.call("qk_norm_rope", dict(head_dim=dim), q, k, k, weight, weight, 1e-6, cos, cos, fp8_cache, fp8_cache, slots)
    r.call("attention", shape, q, fp8_cache, fp8_cache, table, meta(step.num_seqs, **int32),
           meta(step.num_seqs + 1, **int32), 1.0, window)
    if bidirectional_spans and step.new > 1:  # images come in prefills: decode steps never carry key ends
        for kv_cache in (cache, fp8_cache):
            r.call("attention", {**shape, "bidirectional_spans": True}, q, kv_cache, kv_cache, table,
                   meta(step.num_seqs, **int32), meta(step.num_seqs + 1, **int32), 1.0, window,
                   key_ends=meta(step.tokens, **int32))
    if layer.k_eq_v:  # the model's layers store V alone and rebuild K (models/gemma4.py)
        for v_cache in (cache, fp8_cache):
            r.call("qk_norm_rope", dict(head_dim=dim), q, k, k, weight, weight, 1e-6, cos, cos, None, v_cache, slots)
            r.call("attention", {**shape, "k_from_v": True}, q, None, v_cache, table, meta(step.num_seqs, **int32),
                   meta(step.num_seqs + 1, **int32), 1.0, window, k_from_v=_key_rule(spec, layer),
                   host=step.host(), derived={})


def _input_form(r: Recorder, n: int, k: int):
    """The quantized input an MXFP4 projection [N, K] asks of the kernel before it at this step, as the target
    platform picks its path (None: it quantizes its input itself)."""
    packed = meta(n, -(-k // K_ALIGN) * K_ALIGN // 2, dtype=torch.uint8)
    with recording(r.platform):
        return input_quantization(r.step.tokens, packed, meta(r.step.tokens, k), True, lookup_scales=True)


def _key_rule(spec: ModelSpec, layer: LayerAttention) -> KFromV:
    inv_freq = inv_freq_from_params(layer.head_dim, spec.rope_parameters(layer.kind))
    table = meta(spec.max_position_embeddings, layer.head_dim, dtype=torch.float32)
    return KFromV(meta(layer.head_dim), table, table, rotary_pairs(inv_freq))


def _mxfp4_linear(r: Recorder, op: str, rows: int, n: int, k: int, gated: bool = False) -> None:
    """gated: the MLP's down projection fed [gate | up] (a GatedInput), where its path takes that."""
    k_padded = -(-k // K_ALIGN) * K_ALIGN
    weight, scale = meta(n, k_padded // 2, dtype=torch.uint8), meta(n, k_padded // 32, dtype=torch.uint8)
    x = meta(rows, 2 * k if gated else k)
    if gated:
        with recording(r.platform):  # the path as the target platform picks it
            if not gated_path(rows, n, x, True, lookup_scales=True):
                return
    if gated:
        r.call(op, dict(n=n, k=k, dynamic_input=True), x, weight, scale, SCALES, method="matmul_gated")
    else:
        r.call(op, dict(n=n, k=k, dynamic_input=True), x, weight, scale, SCALES, True, method="matmul")


def _mxfp4_projections(hf: dict, layers: list[LayerAttention]) -> set[tuple[int, int]]:
    """(N, K) of every MXFP4 Linear: the fused qkv (q and k on k_eq_v layers, q alone on KV-sharing ones) and o
    per layer kind, gate_up and down of the dense MLP (models/gemma4.py builds them so)."""
    hidden, heads, inner = hf["hidden_size"], hf["num_attention_heads"], hf["intermediate_size"]
    shapes = {(2 * inner, hidden), (hidden, inner)}
    for layer in layers:
        q, kv = heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
        shapes |= {(q + (kv if layer.k_eq_v else 2 * kv), hidden), (hidden, q)}
        if hf.get("num_kv_shared_layers"):
            shapes.add((q, hidden))
    if hf.get("use_double_wide_mlp"):
        shapes |= {(4 * inner, hidden), (hidden, 2 * inner)}
    return shapes


def _moe_experts(r: Recorder, hf: dict) -> None:
    """The fused routed experts of a MoE layer, bf16 and MXFP4 (K padded as MXFP4Experts pads it)."""
    experts, top_k, tokens = hf["num_experts"], hf["top_k_experts"], r.step.tokens
    hidden, inner = hf["hidden_size"], hf["moe_intermediate_size"]
    routing = (meta(tokens, top_k, dtype=torch.float32), meta(tokens, top_k, dtype=torch.int64))
    r.call("router_topk", dict(experts=experts), meta(tokens, experts), meta(experts), top_k)
    r.call("router", dict(experts=experts), meta(tokens, hidden), meta(experts, hidden), meta(experts), top_k)
    r.call("moe_experts", dict(experts=experts, dtype=torch.bfloat16), meta(tokens, hidden),
           meta(experts, 2 * inner, hidden), meta(experts, hidden, inner), *routing)
    packed = []
    for rows, k in ((2 * inner, hidden), (hidden, inner)):
        k_padded = -(-k // K_ALIGN) * K_ALIGN
        packed += [meta(experts, rows, k_padded // 2, dtype=torch.uint8),
                   meta(experts, rows, k_padded // 32, dtype=torch.uint8)]
    r.call("mxfp4_moe_experts", dict(experts=experts, dtype=torch.bfloat16, dynamic_input=True),
           meta(tokens, hidden), *packed, *routing, SCALES, True, method="experts")


def _split_k_output(rows: int, n: int) -> PartialSums:
    """A projection's output as split-K slices (a linked Linear's PartialSums); the norms read it so."""
    return PartialSums(meta(SPLIT_K_SLICES, rows, n, dtype=torch.float32), torch.bfloat16)


def _norms_of_projections(r: Recorder, spec: ModelSpec) -> None:
    """The residual updates as the layers make them: reading a projection's split-K slices, and writing the next
    norm quantized for an MXFP4 projection of the hidden state (qkv, gate_up) where its path asks for that."""
    hidden, tokens = spec.hf["hidden_size"], r.step.tokens
    x, weight, slices = meta(tokens, hidden), meta(hidden), _split_k_output(tokens, hidden)
    r.call("rms_norm_residual", dict(dim=hidden), slices, x, weight, 1e-6, None, weight)
    r.call("rms_norm_residual", dict(dim=hidden), slices, x, weight, 1e-6, meta(1), weight)
    for n, k in sorted(_mxfp4_projections(spec.hf, spec.layers)):
        form = _input_form(r, n, k) if k == hidden else None
        if form is not None:
            r.call("rms_norm_residual", dict(dim=hidden), slices, x, weight, 1e-6, None, weight, quantize=form)


def _model_step(r: Recorder, spec: ModelSpec) -> None:
    hf, tokens = spec.hf, r.step.tokens
    hidden = hf["hidden_size"]
    x, weight = meta(tokens, hidden), meta(hidden)
    r.call("rms_norm", dict(dim=hidden), x, weight, 1e-6)
    _tensor_parallel_all_reduce(r, hidden)
    r.call("rms_norm_residual", dict(dim=hidden), x, x, weight, 1e-6, None, weight)  # after attention
    r.call("rms_norm_residual", dict(dim=hidden), x, x, weight, 1e-6, meta(1), weight)  # after the MLP
    _norms_of_projections(r, spec)
    window = hf.get("sliding_window")
    # transformers' create_masks_for_vision_model: image blocks attend both ways on the sliding layers alone
    vision_spans = hf.get("use_bidirectional_attention") == "vision"
    for layer in sorted(set(spec.layers), key=lambda layer: (layer.kind, layer.head_dim, layer.num_kv_heads)):
        sliding = layer.kind == "sliding"
        _attention_layer(r, spec, layer, window if sliding else None, sliding and vision_spans)
    inner = [hf["intermediate_size"]] + ([2 * hf["intermediate_size"]] if hf.get("use_double_wide_mlp") else [])
    for width in inner:
        r.call("gelu_tanh_and_mul", dict(dim=width), meta(tokens, 2 * width))
    ple = hf.get("hidden_size_per_layer_input") or 0
    if ple:
        r.call("rms_norm", dict(dim=ple), meta(tokens, len(spec.layers), ple), meta(ple), 1e-6)
    for n, k in sorted(_mxfp4_projections(hf, spec.layers) | {(hf["vocab_size"], hidden)}):
        r.call("linear", dict(n=n, k=k), meta(tokens, k), meta(n, k))  # bf16 weights (+ the tied lm_head)
    for n, k in sorted(_mxfp4_projections(hf, spec.layers)):
        _mxfp4_linear(r, "mxfp4_linear", tokens, n, k)
    for width in inner:
        _mxfp4_linear(r, "mxfp4_linear", tokens, hidden, width, gated=True)
    fp8_linears(r, _mxfp4_projections(hf, spec.layers), meta)
    if hf.get("enable_moe_block"):
        # the two feed-forward branches joined in the residual update: the dense MLP's output (or its split-K
        # slices) and the routed experts' unsummed slots
        slots = PartialSums(meta(hf["top_k_experts"], tokens, hidden, dtype=torch.float32), torch.bfloat16)
        for dense in (x, _split_k_output(tokens, hidden)):
            r.call("rms_norm_residual", dict(dim=hidden), NormedPair(dense, slots, weight, weight), x, weight, 1e-6,
                   meta(1), weight)
        # the sum after attention and its three norms: dense MLP, router and experts inputs
        r.call("rms_norm_residual", dict(dim=hidden), _split_k_output(tokens, hidden), x, weight, 1e-6, None,
               (weight, weight, weight))
        _moe_experts(r, hf)
        fp8_moe_experts(r, hf, meta)


# The two vision tower shapes by their vision_config (31B and 26B-A4B: 16 heads x 72; E2B and E4B: 12 x 64), for the
# default configs: of their example configs only gemma-4-31B-it-vision has a tower.
VISION_TOWERS = {"31B/26B-A4B tower": dict(num_attention_heads=16, num_key_value_heads=16, head_dim=72),
                 "E2B/E4B tower": dict(num_attention_heads=12, num_key_value_heads=12, head_dim=64)}
# The images one step encodes (engine.image_embeds.largest_step_images): one of the most patches at the default
# budget, and two packed (a small one beside it).
LARGEST_IMAGE_PATCHES = MAX_SOFT_TOKENS * 3 ** 2  # 3 x 3 patches pooled into each soft token
IMAGE_STEPS = (Step("images-1", 1, LARGEST_IMAGE_PATCHES, 0), Step("images-2", 2, LARGEST_IMAGE_PATCHES, 0))


def _vision_tower(r: Recorder, vision_cfg: dict) -> None:
    """The tower's attention inputs (q/k/v norms + 2-D RoPE) and encoder attention over the step's packed images,
    in the model's dtype."""
    heads, dim = vision_cfg["num_attention_heads"], vision_cfg["head_dim"]
    kv_heads = vision_cfg.get("num_key_value_heads") or heads
    lengths = [r.step.new // 4] * (r.step.num_seqs - 1) + [r.step.new]
    rows, angles, norm = sum(lengths), meta(sum(lengths), 2, dim // 2), meta(dim)
    r.call("axial_qkv_norm_rope", dict(head_dim=dim), meta(rows, (heads + 2 * kv_heads) * dim), norm, norm, 1e-6,
           angles, angles, heads, kv_heads)
    q, kv = meta(sum(lengths), heads, dim), meta(sum(lengths), kv_heads, dim)
    packed = PackedSequences(meta(len(lengths) + 1, dtype=torch.int32), tuple(lengths))
    shape = dict(head_dim=dim, gqa=heads // kv_heads, dtype=torch.bfloat16)
    r.call("encoder_attention", shape, q, kv, kv, packed, dim ** -0.5)
    if dim & (dim - 1):  # the split head too (tuning.ENCODER_SPLIT_HEADS), where it is not the default
        r.call("encoder_attention", shape, q, kv, kv, packed, dim ** -0.5, split=True)


def vision_launches(platform: Platform, towers: dict[str, dict] | None = None) -> list[tuple[str, KernelLaunch]]:
    """(workload, launch) of each vision tower's kernels at the image steps (default: VISION_TOWERS)."""
    launches = []
    for name, vision_cfg in (towers or VISION_TOWERS).items():
        for step in IMAGE_STEPS:
            recorder = Recorder(platform, name, step, [])
            _vision_tower(recorder, vision_cfg)
            launches += recorder.launches
    return launches


def gemma4_launches(platform: Platform, models: list[Path] | None = None) -> list[tuple[str, KernelLaunch]]:
    """(workload, launch) for every step of every model (default: the example Gemma 4 configs, and the vision
    towers); a model given with a vision_config adds its tower's."""
    launches = []
    for model in models or [EXAMPLE_CONFIGS / name for name in GEMMA4_CONFIGS]:
        spec = load_model_spec(model)
        for step in STEPS:
            recorder = Recorder(platform, Path(model).name, step, [])
            _model_step(recorder, spec)
            launches += recorder.launches
        if models and spec.vision is not None:
            launches += vision_launches(platform, {f"{Path(model).name} tower": spec.vision.hf})
    return launches + ([] if models else vision_launches(platform))
