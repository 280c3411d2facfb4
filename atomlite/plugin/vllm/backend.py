"""vLLM v1 attention backend whose forward is atomlite's own Attention layer (KV write + paged attention, kernels
picked by atomlite's dispatch table: AITER on ROCm, Triton, torch reference), run on vLLM's paged KV cache.

vLLM hands each layer a view [num_blocks, num_kv_heads, block_size, 2 * head_size] whose strides follow the
resolved KVCacheLayout; kv_layout.split_kv_cache turns it into atomlite's cache shape without a copy, with unit
stride on head_size, which every atomlite kernel accepts, so this backend needs no layout preference.
"""
import logging
from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)

from atomlite.model_ops import dispatch
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.context import ForwardContext, GroupBatch, HostBatch
from atomlite.model_ops.platform import Platform, detect_platform
from atomlite.plugin.vllm.kv_layout import split_kv_cache

logger = logging.getLogger("vllm.atomlite")
GROUP = 0  # vLLM gives each layer its own group's metadata, so the layer sees a single group
_logged_shapes: set[tuple] = set()


def vllm_platform(vllm_config: VllmConfig | None = None) -> Platform:
    """The atomlite platform of the device vLLM runs this worker on."""
    config = vllm_config or get_current_vllm_config()
    device = getattr(config.device_config, "device", None) if config.device_config else None
    device = torch.device(device or "cpu")
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return detect_platform(device)


class AtomliteAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]  # the cache holds K/V in the model dtype
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_name() -> str:
        # vLLM resolves backends through its enum; CUSTOM is the member reserved for out-of-tree backends.
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type["AtomliteAttentionImpl"]:
        return AtomliteAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["AtomliteMetadataBuilder"]:
        return AtomliteMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any: dispatch falls back to the torch reference where a kernel's limits refuse a shape

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True


@dataclass
class AtomliteMetadata:
    num_actual_tokens: int
    context: ForwardContext  # the step's batch as atomlite's attention reads it, one per step and KV cache group


class AtomliteMetadataBuilder(AttentionMetadataBuilder[AtomliteMetadata]):
    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config: VllmConfig, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AtomliteMetadata:
        m = common_attn_metadata
        if m.causal is not True:
            raise NotImplementedError("atomlite's attention backend runs causal decoder attention only")
        n = m.num_actual_tokens
        # vLLM's own host copies and maxima: no layer reads lengths back from the device.
        host = HostBatch(m.query_start_loc_cpu.tolist(), None, m.max_query_len, m.max_seq_len,
                         decode_only=m.max_query_len == 1 and n == m.num_reqs)
        groups = {GROUP: GroupBatch(m.slot_mapping[:n], m.block_table_tensor)}
        return AtomliteMetadata(n, ForwardContext(None, m.query_start_loc, m.seq_lens, groups, host))


def bidirectional_image_problem(model_config) -> str | None:
    """Why this backend cannot serve the model: vLLM asks for bidirectional image attention (Gemma 4 with
    text_config.use_bidirectional_attention "vision" and images enabled), which this backend would run causally."""
    if model_config is None or not model_config.is_mm_prefix_lm or not _takes_images(model_config):
        return None
    return ("atomlite's attention backend has no bidirectional image attention, which this checkpoint's "
            "use_bidirectional_attention='vision' needs: image prompts would be answered wrongly. Serve images "
            "with vLLM's own attention backend on GPU (drop --attention-backend CUSTOM / ATOMLITE_VLLM_CPU_ATTENTION), "
            "or serve text only with --limit-mm-per-prompt '{\"image\": 0, \"video\": 0}'")


def _takes_images(model_config) -> bool:
    """Whether vLLM will put images or video in prompts: a multimodal model whose limits allow some (a text model,
    such as atomlite's own Gemma 4, or --limit-mm-per-prompt of 0 for both, runs text alone)."""
    mm = model_config.multimodal_config
    return mm is not None and any(mm.get_limit_per_prompt(m) for m in ("image", "video"))


def _refuse(alibi_slopes, logits_soft_cap, attn_type, kv_cache_dtype, extra: dict) -> str | None:
    if alibi_slopes is not None:
        return "ALiBi"
    if logits_soft_cap:
        return "attention logit softcapping"
    if attn_type != AttentionType.DECODER:
        return f"attention type {attn_type}"
    if kv_cache_dtype not in AtomliteAttentionBackend.supported_kv_cache_dtypes:
        return f"kv_cache_dtype {kv_cache_dtype}"
    if extra.get("sinks") is not None:
        return "attention sinks"
    return None


class AtomliteAttentionImpl(AttentionImpl[AtomliteMetadata]):
    calls: ClassVar[int] = 0  # forwards that attended a real batch, all layers: proof this backend ran

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: str | None = None,
                 **extra) -> None:
        unsupported = _refuse(alibi_slopes, logits_soft_cap, attn_type, kv_cache_dtype, extra)
        if unsupported:
            raise NotImplementedError(f"atomlite's attention backend does not support {unsupported}; "
                                      f"pick another vLLM attention backend for this model")
        problem = bidirectional_image_problem(get_current_vllm_config().model_config)
        if problem:
            raise NotImplementedError(problem)
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.sliding_window, self.kv_cache_dtype = sliding_window, kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        platform = vllm_platform()
        with dispatch.use(platform):
            self.attn = Attention(num_heads, self.num_kv_heads, head_size, self.scale, sliding_window)
        shape = (head_size, sliding_window, num_heads, self.num_kv_heads)
        if shape not in _logged_shapes:
            _logged_shapes.add(shape)
            choice = dispatch.choose("attention", platform, head_dim=head_size, window=sliding_window is not None,
                                     gqa=num_heads // self.num_kv_heads)
            logger.info("atomlite attention backend: head_dim=%d window=%s heads=%d/%d -> %s kernel (%s)",
                        *shape, choice.backend, choice.reason)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None,
                kv_cache: torch.Tensor, attn_metadata: AtomliteMetadata | None, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("atomlite's attention backend does not fuse output quantization")
        if attn_metadata is None:  # profiling / warm-up run: nothing is cached yet
            return output
        n = attn_metadata.num_actual_tokens
        k_cache, v_cache = split_kv_cache(kv_cache, self.head_size)
        self.attn.bind_cache(k_cache, v_cache, GROUP)
        writes = self.kv_sharing_target_layer_name is None and key is not None
        out = self.attn(query[:n], key[:n] if writes else None, value[:n] if writes else None,
                        attn_metadata.context)
        output[:n].copy_(out.view(output[:n].shape))
        AtomliteAttentionImpl.calls += 1
        return output
