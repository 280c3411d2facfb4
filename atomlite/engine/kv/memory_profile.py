"""GPU memory sized by measurement, as vLLM users expect: after the weights load, a profiling prefill of
--max-num-batched-tokens tokens and an eager decode at the largest graph batch measure the activation peaks on a
small temporary KV cache, and a model with a vision tower encodes the largest images one step may hold; the KV cache
then gets what --gpu-memory-utilization leaves of the GPU after the weights, the larger of the prefill's and the
towers' peaks, the encoder cache, the decode graphs' pool (about one decode forward's peak), the towers' graph pools
and memory outside torch's allocator."""
import math
from dataclasses import dataclass

import torch

from atomlite.engine.kv.kv_layout import page_layout
from atomlite.engine.kv.kv_cache import KVCacheManager, group_specs
from atomlite.engine.runner.model_runner import ModelRunner
from atomlite.engine.sequence import Sequence
from atomlite.sampling_params import SamplingParams

GiB = 2**30
# A graph pool cannot reuse the allocator's free blocks and its split-KV scratch is sized for max_model_len: the
# eager decode's peak, a quarter more, and a fixed margin (31B: 146-282 MiB measured at batch 16).
GRAPH_SLACK, GRAPH_MARGIN = 1.25, 256 * 2**20


@dataclass
class MemoryProfile:
    total: int
    utilization: float
    weights: int
    prefill_peak: int
    graphs: int
    outside_torch: int
    encoder_cache: int = 0
    encoder_peak: int = 0  # the vision tower's own peak at the largest step's images (in prefill_peak's max)
    encoder_graphs: int = 0  # the vision tower's graph pool (about its peak), held beside the activations' peak
    audio_graphs: int = 0  # the audio tower's graph pool (about one longest clip's peak), held beside it too

    @property
    def kv_budget(self) -> int:
        return (int(self.total * self.utilization) - self.weights - self.prefill_peak - self.graphs
                - self.encoder_graphs - self.audio_graphs - self.outside_torch - self.encoder_cache)

    def describe(self) -> str:
        parts = [("weights", self.weights), ("activation peak", self.prefill_peak), ("graphs", self.graphs),
                 ("outside torch", self.outside_torch), ("KV cache", max(self.kv_budget, 0))]
        if self.audio_graphs:
            parts.insert(3, ("audio tower graphs", self.audio_graphs))
        if self.encoder_graphs:
            parts.insert(3, ("vision tower graphs", self.encoder_graphs))
        if self.encoder_cache:
            parts.insert(3, ("encoder cache", self.encoder_cache))
        split = ", ".join(f"{name} {size / GiB:.2f} GiB" for name, size in parts)
        return f"GPU memory ({self.utilization:.0%} of {self.total / GiB:.1f} GiB): {split}"


def _temporary_cache(specs, tokens: int, seqs: int, block_size: int, device) -> KVCacheManager:
    """Blocks for one sequence of `tokens` tokens plus `seqs` one-block sequences, in every group."""
    grouped, _ = group_specs(specs)
    layout = page_layout(grouped, block_size)
    num_pages = layout.pages_for([math.ceil(tokens / block_size) + seqs + 2] * len(grouped)) + 1
    return KVCacheManager(specs, num_pages, block_size, device, enable_prefix_caching=False)


def _peak_of(run, device) -> int:
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def _sequences(kv: KVCacheManager, lengths: list[int]) -> list[tuple[Sequence, int]]:
    batch = []
    for length in lengths:
        seq = Sequence([0] * length, SamplingParams(max_tokens=1))
        if not kv.allocate(seq, length):
            raise RuntimeError("the profiling cache is too small")  # sized above: a bug if it happens
        batch.append((seq, length))
    return batch


def profile_memory(model, specs, device: torch.device, utilization: float, prefill_tokens: int,
                   decode_batch: int, block_size: int, step_images: tuple[list, list] | None = None,
                   encoder_cache: int = 0, encoder_graphs: bool = False,
                   step_audio: list | None = None, audio_graphs: bool = False,
                   prefill_graphs: bool = False) -> MemoryProfile:
    """Runs the two profiling forwards on a temporary cache (freed before returning); step_images: the pixels and
    position ids of the most the vision tower encodes in one step, step_audio: the log-mel features of the most the
    audio tower encodes in one step, whose peaks count where they are the larger; encoder_graphs: the vision tower
    will replay graphs, whose pool holds about its peak for good (the eager fallback, a step of more images than a
    graph takes, may still need the peak itself); audio_graphs: the audio tower will replay graphs of one clip each,
    whose pool holds about the longest clip's peak for good; prefill_graphs: prefill and mixed steps will replay
    graphs, whose pool holds about the prefill's peak for good (beside the peak an eager step still needs)."""
    weights = torch.cuda.memory_allocated(device)
    vision_peak = _peak_of(lambda: model.embed_images(*step_images), device) if step_images else 0
    audio_peak = _peak_of(lambda: model.embed_audio(step_audio), device) if step_audio else 0
    clip_peak = _peak_of(lambda: model.embed_audio(step_audio[:1]), device) if step_audio and audio_graphs else 0
    tower_peak = max(vision_peak, audio_peak)
    kv = _temporary_cache(specs, prefill_tokens, decode_batch, block_size, device)
    runner = ModelRunner(model, kv, device)
    prefill = _sequences(kv, [prefill_tokens])
    prefill_peak = _peak_of(lambda: runner.execute(prefill), device)
    decode_peak = _peak_of(lambda: runner.execute(_sequences(kv, [1] * decode_batch)), device) if decode_batch else 0
    for attention in model.attention_layers():  # let the temporary cache go before the real one is allocated
        attention.bind_cache(None, None, None)
    del runner, kv, prefill
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    outside = (total - free) - torch.cuda.memory_reserved(device)
    graphs = int(decode_peak * GRAPH_SLACK) + GRAPH_MARGIN if decode_batch else 0
    if prefill_graphs:
        graphs += int(prefill_peak * GRAPH_SLACK)
    tower_graphs = int(vision_peak * GRAPH_SLACK) if encoder_graphs else 0
    return MemoryProfile(total, utilization, weights, max(prefill_peak, tower_peak), graphs, outside, encoder_cache,
                         tower_peak, tower_graphs, int(clip_peak * GRAPH_SLACK))
