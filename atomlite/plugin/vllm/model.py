"""atomlite's Gemma 4 as a vLLM model: the standalone model class itself, with a thin adapter.

The adapter only (1) puts a vLLM Attention layer (backed by atomlite's attention backend) in each layer's `attn`
slot, so vLLM owns the KV cache, scheduling and metadata, (2) turns vLLM's (input_ids, positions) call into
atomlite's (ids, ForwardContext), (3) feeds vLLM's weight iterator through the same name mapping, shard narrowing
and weight_loaders as atomlite's loader, and (4) builds the model over vLLM's tensor-parallel group, so each rank
holds atomlite's shard of every sharded layer and its collectives run on that group. Every other line of the
forward pass is atomlite's.
"""
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention import Attention as VllmAttention

from atomlite import distributed
from atomlite.config import load_model_spec
from atomlite.errors import ConfigError
from atomlite.loader import finish_loading, kv_scale_of, load_tensor, resolve
from atomlite.model_ops import dispatch, fusion
from atomlite.model_ops.context import ForwardContext
from atomlite.models.gemma4 import Gemma4ForCausalLM
from atomlite.plugin.vllm import logger
from atomlite.plugin.vllm.backend import AtomliteAttentionBackend, vllm_platform


class VllmPagedAttention(nn.Module):
    """atomlite's attention interface, attn(q, k, v, ctx) -> [T, H, D], served by a vLLM Attention layer."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, window: int | None,
                 vllm_config: VllmConfig, layer_name: str, shares_with: str | None, prepare_kernel):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.prepare_kernel, self.prepare_qkv = prepare_kernel, prepare_kernel.fn
        self.vllm_attn = VllmAttention(num_heads, head_dim, scale, num_kv_heads=num_kv_heads,
                                       cache_config=vllm_config.cache_config, per_layer_sliding_window=window,
                                       prefix=layer_name, kv_sharing_target_layer_name=shares_with,
                                       attn_backend=AtomliteAttentionBackend)

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                ctx: ForwardContext) -> torch.Tensor:
        return self.vllm_attn(q, k, v).view(q.shape[0], self.num_heads, self.head_dim)

    def can(self, capability: str) -> bool:
        """What the q/k/v prepare takes in (a fused projection's partial sums); its output goes to vLLM as is."""
        return capability.startswith("reads_") and self.prepare_kernel.can(capability)

    def forward_raw(self, q, k, v, q_weight, k_weight, eps: float, cos, sin, ctx: ForwardContext) -> torch.Tensor:
        """atomlite's fused norms + RoPE without its KV write: vLLM's attention layer stores K and V itself."""
        q, k, v = self.prepare_qkv(q, k, v, q_weight, k_weight, eps, cos, sin)
        return self.forward(q, k, v, ctx)


def _checkpoint_dir(vllm_config: VllmConfig) -> Path:
    path = Path(vllm_config.model_config.model)
    if not (path / "config.json").exists():
        raise ConfigError(f"atomlite's Gemma 4 in vLLM reads config.json from a local checkpoint folder; "
                          f"{vllm_config.model_config.model} is not one: download it first and pass its path")
    return path


TEXT_ONLY = ("atomlite's Gemma 4 in vLLM is text only: {} has a vision tower, which it does not load, and vLLM "
             "refuses requests with images for it. For images serve vLLM's own Gemma4ForConditionalGeneration "
             "(drop the AtomliteGemma4ForCausalLM override), with atomlite's attention backend if the checkpoint's "
             "image attention is causal, or `atomlite serve`.")


def vllm_tensor_parallel() -> distributed.TensorParallel:
    """vLLM's tensor-parallel group as atomlite's: this worker's rank and size, and the group's torch.distributed
    device group (gloo on vLLM's CPU platform, NCCL/RCCL on GPUs), which atomlite's all-reduces and gathers use."""
    from vllm.distributed.parallel_state import get_tp_group
    group = get_tp_group()
    if group.world_size == 1:
        return distributed.TensorParallel()
    return distributed.TensorParallel(group.rank_in_group, group.world_size, group.device_group)


class AtomliteGemma4ForCausalLM(Gemma4ForCausalLM):
    """vLLM's model interface over atomlite's Gemma4ForCausalLM (same modules, same parameter names)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        spec = load_model_spec(_checkpoint_dir(vllm_config))
        if spec.vision is not None:
            logger.warning(TEXT_ONLY.format(vllm_config.model_config.model))
        tp = vllm_tensor_parallel()
        with dispatch.use(vllm_platform(vllm_config)), distributed.use(tp):
            super().__init__(spec, max_positions=vllm_config.model_config.max_model_len)
        if tp.size > 1:
            logger.info("atomlite's Gemma 4 on vLLM tensor-parallel rank %d of %d: %d parameter bytes (its shard)",
                        tp.rank, tp.size, sum(p.numel() * p.element_size() for p in self.parameters()))
        name = (f"{prefix}." if prefix else "") + "model.layers.{}.self_attn.attn"
        for i, layer in enumerate(self.model.layers):
            old = layer.self_attn.attn
            target = self.model.share_targets.get(i)
            layer.self_attn.attn = VllmPagedAttention(
                old.num_heads, old.num_kv_heads, old.head_dim, old.scale, old.window, vllm_config,
                name.format(i), None if target is None else name.format(target), old.prepare_kernel)
        fusion.link(self)  # after the swap: vLLM's attention layer takes part in no fusion

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        if intermediate_tensors is not None or inputs_embeds is not None:
            raise NotImplementedError("atomlite's Gemma 4 in vLLM takes token ids only (no pipeline parallel, "
                                      "no input embeddings)")
        # Batch layout reaches attention through vLLM's own forward context, so atomlite's needs positions only.
        return self.model(input_ids, ForwardContext(positions, None, None, {}))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Same name mapping, shard narrowing (read_shard: this rank's part under tensor parallelism) and
        per-parameter weight_loaders as atomlite's loader, fed by vLLM's iterator of whole tensors."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if kv_scale_of(self, name) is not None:
                continue  # vLLM owns the KV cache here, and this backend runs 16-bit caches only
            resolved = resolve(self, name, params)
            if resolved is not None:
                target, shard = resolved
                reader = getattr(params.get(target), "read_shard", None)
                load_tensor(params, name, target, shard, tensor if reader is None else reader(tensor, shard), "")
                loaded.add(resolved)
        finish_loading(self, loaded, "vLLM's weight iterator")
        return {target for target, _ in loaded}
