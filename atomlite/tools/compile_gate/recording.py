"""What the real models launch, recorded: each config of examples/configs is built on the meta device as the engine
builds it (its kernels chosen by dispatch for the target platform, its layers linked by fusion), its KV cache laid
out by the engine's KVCacheManager and bound by its ModelRunner, and its own forward run at the engine's default
steps while the Triton launchers record their launches instead of making them (model_ops.triton.common.recording).
Nothing here restates a model: the steps come from EngineConfig's defaults (the KV blocks the platform's,
Platform.block_size), the shapes from the model.

The steps: a first prefill chunk of --max-num-batched-tokens and four prompts' later chunks; eager decode of one
sequence at --max-model-len (split-KV) and of --max-num-seqs sequences; every decode graph's bucket (replayed as a
capture runs it) and every prefill graph's bucket (padding alone, as a capture runs it); each of those with the KV
cache in the model's dtype and in fp8 (--kv-cache-dtype fp8). A model
with a vision tower adds every tower graph's bucket and the prefills that carry an image's key ends; one with an audio
tower every audio tower graph's bucket. Where dispatch
gives the platform a custom all-reduce, the decode and prefill graphs again as rank 0 of 2 and of 8 ranks. A model whose
projections take LoRA adapters (unquantized) adds a prefill and the decode graphs with adapter slots attached
(--enable-lora at vLLM's defaults: one slot of rank 16).

An assistant checkpoint (an MTP drafter, a folder named as its target's with -assistant, as on the hub) is recorded
as the engine runs it beside its target with NUM_DRAFTS drafts a step: the target's verify steps (eager and every
verify graph's bucket) and the assistant's draft rounds (eager and every draft graph's bucket), per KV cache dtype.
"""
import contextlib
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from atomlite import distributed
from atomlite.config import EngineConfig
from atomlite.distributed import TensorParallel
from atomlite.distributed.parallel import graph_steps
from atomlite.engine.runner.decode_graphs import graph_batch_sizes, verify_graphs_off_reason
from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.llm_engine import construct_model
from atomlite.engine.runner.model_runner import ModelRunner
from atomlite.engine.runner.rank import assistant_spec_for
from atomlite.engine.spec.drafters import AssistantDrafter
from atomlite.engine.runner.step_inputs import StepInputs
from atomlite.errors import ConfigError
from atomlite.model_ops import dispatch
from atomlite.model_ops.mxfp4_linear import make_row_copies
from atomlite.model_ops.peer_memory import (MAX_SIGNALS, PeerChannel, PeerMemory, plain_slot_bytes,
                                            row_slot_bytes)
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.triton.common import KernelLaunch, recording
from atomlite.model_ops.triton.mxfp4 import family as mxfp4_family
from atomlite.registry import mtp_assistant

EXAMPLE_CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"
META = torch.device("meta")
NUM_PAGES = 4096
TENSOR_PARALLEL_SIZES = (2, 8)
ASSISTANT_SUFFIX = "-assistant"  # the hub's names: google/gemma-4-31B-it-assistant drafts for google/gemma-4-31B-it
NUM_DRAFTS = 4  # num_speculative_tokens of README's and docs/SPECULATIVE.md's examples

# The sm_90 block-scaled path multiplies by cuBLAS (torch's scaled_mm), which has no meta kernel: the gate needs
# only the Triton launches around it, so on meta the GEMM just hands back its output.
_META_GEMMS = torch.library.Library("aten", "IMPL", "Meta")
_META_GEMMS.impl("_scaled_mm_v2.out", lambda *args, out, **kwargs: out)

Launches = list[tuple[str, KernelLaunch]]


def example_configs() -> list[Path]:
    """Every config of examples/configs."""
    return sorted(path.parent for path in EXAMPLE_CONFIGS.glob("*/config.json"))


@dataclass(frozen=True)
class Step:
    """An eager step: num_seqs sequences, each computing `new` tokens and holding `context` keys after it."""
    name: str
    num_seqs: int
    new: int
    context: int


def eager_steps(config: EngineConfig) -> list[Step]:
    tokens, longest = config.max_num_batched_tokens, config.max_model_len
    return [Step("prefill", 1, tokens, tokens), Step("prefill-chunks", 4, tokens // 4, tokens),
            Step("decode-1", 1, 1, longest), Step(f"decode-{config.max_num_seqs}", config.max_num_seqs, 1, longest // 2)]


def graph_batch(config: EngineConfig) -> int:
    """The largest decode batch the engine replays from a graph (engine/runner/rank.py's graph_batch on a GPU)."""
    return min(config.max_graph_batch or config.max_num_seqs, config.max_num_seqs, config.max_num_batched_tokens)


def step_inputs(kv: KVCacheManager, num_seqs: int, new: int, context: int, image: bool = False) -> StepInputs:
    """A step's host inputs as StepInputBuilder builds them; with image, the whole chunk is one image's soft tokens
    (each row's key end the chunk's end, ForwardContext.key_ends)."""
    positions = np.concatenate([np.arange(context - new, context) for _ in range(num_seqs)]).astype(np.int64)
    blocks = -(-context // kv.block_size)
    tables = [np.zeros((num_seqs, blocks), dtype=np.int32) for _ in kv.groups]
    slots = [np.zeros(num_seqs * new, dtype=np.int64) for _ in kv.groups]
    key_ends = np.full(num_seqs * new, context, dtype=np.int32) if image else None
    return StepInputs(np.zeros(num_seqs * new, dtype=np.int64), positions, [i * new for i in range(num_seqs + 1)],
                      [context] * num_seqs, slots, tables, key_ends)


class _Recorder:
    def __init__(self, platform: Platform, label: str):
        self.platform, self.label, self.launches = platform, label, []

    @contextlib.contextmanager
    def step(self, name: str):
        with torch.inference_mode(), recording(self.platform) as launches:
            yield
        self.launches += [(f"{self.label} {name}", launch) for launch in launches]


def _eager(recorder: _Recorder, model, runner: ModelRunner, kv: KVCacheManager, step: Step, image: bool = False,
           every_row: bool = False):
    """One eager step; logits of each sequence's last row, or of every row (a verify step's)."""
    inputs = step_inputs(kv, step.num_seqs, step.new, step.context, image)
    with recorder.step(step.name + (" with an image" if image else "")):
        ids, ctx = runner.inputs.context(inputs)
        hidden = model(ids, ctx)
        last_rows = torch.tensor(inputs.query_starts[1:], device=META) - 1
        model.compute_logits(hidden if every_row else hidden[last_rows])


def _graphs(recorder: _Recorder, runner: ModelRunner, kv: KVCacheManager, config: EngineConfig) -> None:
    graphs = runner.use_decode_graphs(graph_batch(config), config.max_model_len, capture=False)
    for bucket in graph_batch_sizes(graph_batch(config)):
        with recorder.step(f"decode graph {bucket}"), graph_steps():  # the forwards a capture runs
            graphs.run(step_inputs(kv, bucket, 1, config.max_model_len // 2))


def _prefill_graphs(recorder: _Recorder, runner: ModelRunner, config: EngineConfig) -> None:
    """Each prefill graph's bucket, as its capture runs it (the bucket's padding sequences alone)."""
    graphs = runner.use_prefill_graphs(config.max_num_batched_tokens, config.max_num_seqs, config.max_model_len,
                                       capture=False)
    for bucket in graphs.sizes:
        with recorder.step(f"prefill graph {bucket}"), graph_steps():
            graphs.fill_padding_alone(bucket)
            graphs._forward(bucket)


def _audio_graphs(recorder: _Recorder, model, config: EngineConfig) -> None:
    """Each audio tower graph's bucket, as its capture runs it (a clip of the bucket's whole length)."""
    from atomlite.engine.images.image_embeds import longest_clip
    from atomlite.multimodal.audio import FRAMES_PER_SOFT_TOKEN
    graphs = model.use_audio_graphs(longest_clip(config.max_num_batched_tokens, config.max_num_encoder_input_tokens),
                                    capture=False)
    for bucket in graphs.sizes:
        with recorder.step(f"audio tower graph {bucket}"):
            graphs.frames.fill_(bucket * FRAMES_PER_SOFT_TOKEN)
            graphs._forward(bucket)


def _tower_graphs(recorder: _Recorder, model, config: EngineConfig) -> None:
    """Each tower graph's bucket, as its capture runs it (one packed sequence of the bucket's patches)."""
    from atomlite.models.gemma4_vision_graphs import MAX_IMAGES
    graphs = model.use_image_graphs(config.max_num_encoder_input_tokens, capture=False)
    for bucket in graphs.sizes:
        with recorder.step(f"tower graph {bucket}"):
            graphs._forward(bucket, (bucket * graphs.pool,) + (0,) * MAX_IMAGES)


@contextlib.contextmanager
def _scales_as_checkpoints_have_them():
    """MXFP4 weights learn at load what their e8m0 scales allow (ScaleFacts), reading them: a config has no weights,
    so the gate records with the scales real checkpoints have, within the fast expansion's range and the lookup
    kernel's."""
    with (mock.patch.object(mxfp4_family, "needs_wide_scales", lambda scale: False),
          mock.patch.object(mxfp4_family, "scale_bytes_fit", lambda weight, scale: True)):
        yield


def _loaded(model, platform: Platform):
    """The model as loading leaves it: each layer's one-time re-layout (loader.finish_loading's), for platform (FP8
    weights in gfx942's e4m3fnuz, MXFP4 K padded)."""
    with torch.no_grad(), recording(platform), _scales_as_checkpoints_have_them():
        for module in model.modules():
            if hasattr(module, "process_after_loading"):
                module.process_after_loading()
        make_row_copies(model, budget=None)  # as a GPU with the memory for them: their shapes on meta
    return model


def _kv_dtypes(config: EngineConfig, platform: Platform) -> list[torch.dtype]:
    dtypes = [config.kv_dtype(platform)] + ([platform.fp8_dtype] if platform.has_fp8 else [])
    return list(dict.fromkeys(dtypes))


def _model_steps(recorder: _Recorder, model, config: EngineConfig, platform: Platform, eager: bool = True) -> None:
    images = getattr(model, "vision_spec", None) is not None
    for dtype in _kv_dtypes(config, platform):
        kv = KVCacheManager(model.kv_specs(dtype), NUM_PAGES, config.block_size, META)
        runner = ModelRunner(model, kv, META)
        kv_label = f"kv {str(dtype).removeprefix('torch.')}"
        recorder.label, base = f"{recorder.label} {kv_label}", recorder.label
        for step in eager_steps(config) if eager else ():
            _eager(recorder, model, runner, kv, step)
            if images and step.new > 1:
                _eager(recorder, model, runner, kv, step, image=True)
        _graphs(recorder, runner, kv, config)
        _prefill_graphs(recorder, runner, config)
        recorder.label = base


class _MetaPeerMemory(PeerMemory):
    """Rank 0's peer memory as PeerMemory.for_group lays it out, on the meta device (no group to exchange with)."""

    def __init__(self, size: int, platform: Platform):
        self.rank, self.size = 0, size
        self.kernel = dispatch.choose("one_shot_all_reduce", platform, world=size).fn
        int64 = dict(dtype=torch.int64, device=META)
        self.plain, self.rows = (PeerChannel(torch.empty(size, **int64), torch.empty(size, **int64),
                                             torch.empty(MAX_SIGNALS, **int64), 0, size, slot)
                                 for slot in (plain_slot_bytes(size), row_slot_bytes(size)))


@dataclass(frozen=True)
class _RecordingParallel(TensorParallel):
    """Rank 0 of `size`: the custom all-reduce runs (recorded); what the collective library would do returns the
    shape it would return, and launches no Triton kernel."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.peers.all_reduce(x) if self.peers is not None and self.peers.serves(x) else x

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x] * self.size, dim=-1)


def _custom_all_reduce(platform: Platform, size: int) -> bool:
    try:
        dispatch.choose("custom_all_reduce", platform, world=size)
    except dispatch.NoKernel:
        return False
    return True


def _lora_steps(recorder: _Recorder, path: Path, config: EngineConfig, platform: Platform) -> None:
    from atomlite.lora.slots import AdapterSlots
    from atomlite.models.construction import default_dtype
    model = _loaded(construct_model(config, META, platform), platform)
    try:
        with dispatch.use(platform), torch.device(META), default_dtype(config.torch_dtype):
            AdapterSlots(model, config.lora_config, config.max_num_batched_tokens, META)
    except ConfigError:  # quantized projections take no adapters
        return
    recorder.label = f"{path.name} lora"
    kv = KVCacheManager(model.kv_specs(config.kv_dtype(platform)), NUM_PAGES, config.block_size, META)
    runner = ModelRunner(model, kv, META)
    _eager(recorder, model, runner, kv, eager_steps(config)[0])
    _graphs(recorder, runner, kv, config)


def record_model(path: Path, platform: Platform) -> Launches:
    """(workload, launch) of every Triton launch the model at path makes at the gate's steps on platform."""
    config = EngineConfig(model=str(path), device="cpu", block_size=platform.block_size)  # the platform's blocks
    recorder = _Recorder(platform, path.name)
    model = _loaded(construct_model(config, META, platform), platform)
    _model_steps(recorder, model, config, platform)
    if getattr(model, "vision_spec", None) is not None:
        _tower_graphs(recorder, model, config)
    if getattr(model, "audio_spec", None) is not None:
        _audio_graphs(recorder, model, config)
    _lora_steps(recorder, path, config, platform)
    for size in TENSOR_PARALLEL_SIZES:
        sharded = _rank_zero_of(size, config, platform) if _custom_all_reduce(platform, size) else None
        if sharded is not None:
            recorder.label = f"{path.name} rank 0 of {size}"
            _model_steps(recorder, sharded, config, platform, eager=False)
    return recorder.launches


def _rank_zero_of(size: int, config: EngineConfig, platform: Platform):
    """Rank 0's shards of the model under `size` ranks; None where the engine runs the model on one GPU alone."""
    tp = _RecordingParallel(0, size, peers=_MetaPeerMemory(size, platform))
    try:
        with distributed.use(tp):
            return _loaded(construct_model(config, META, platform), platform)
    except ConfigError:  # e.g. FP8 checkpoints, which the engine refuses to shard
        return None


def draft_inputs(kv: KVCacheManager, num_seqs: int, context: int) -> StepInputs:
    """A draft step's host inputs as StepInputBuilder.build_draft builds them: one query per sequence at its newest
    token's position (context - 1), seeing the target's keys before it, writing none."""
    inputs = step_inputs(kv, num_seqs, 1, context - 1)
    no_slots = np.full(num_seqs, -1, dtype=np.int64)
    return StepInputs(inputs.ids, inputs.positions + 1, inputs.query_starts, inputs.seq_lens,
                      [no_slots] * len(kv.groups), inputs.tables)


def _verify_steps(recorder: _Recorder, model, runner: ModelRunner, kv: KVCacheManager, config: EngineConfig):
    """The target's steps that verify NUM_DRAFTS drafts a sequence: eager, and every verify graph's bucket where
    the attention kernels can replay them (engine/runner/rank.py's _set_up_decode_graphs)."""
    queries, longest = NUM_DRAFTS + 1, config.max_model_len
    for step in (Step("verify-1", 1, queries, longest),
                 Step(f"verify-{config.max_num_seqs}", config.max_num_seqs, queries, longest // 2)):
        _eager(recorder, model, runner, kv, step, every_row=True)
    batch = min(graph_batch(config), config.max_num_batched_tokens // queries)
    if verify_graphs_off_reason(model) is not None or not batch:
        return
    graphs = runner.use_verify_graphs(NUM_DRAFTS, batch, longest, capture=False)
    for bucket in graphs.sizes:
        with recorder.step(f"verify graph {bucket}"), graph_steps():
            graphs.run(step_inputs(kv, bucket, queries, longest // 2))


def _draft_rounds(recorder: _Recorder, drafter: AssistantDrafter, kv: KVCacheManager, config: EngineConfig):
    """The assistant's rounds of NUM_DRAFTS steps: eager (AssistantDrafter.propose's loop), and every draft graph's
    bucket."""
    assistant, longest = drafter.assistant, config.max_model_len
    width, dtype = assistant.spec.backbone_hidden_size, assistant.model.norm.weight.dtype
    for num_seqs, context in ((1, longest), (config.max_num_seqs, longest // 2)):
        with recorder.step(f"draft-{num_seqs}"):
            ids, ctx = drafter.inputs.context(draft_inputs(kv, num_seqs, context))
            hidden = torch.empty(num_seqs, width, dtype=dtype, device=META)
            for _ in range(NUM_DRAFTS):
                normed, hidden = assistant(ids, hidden, ctx)
                ids = torch.argmax(assistant.compute_logits(normed), dim=-1)
    graphs = drafter.use_graphs(graph_batch(config), longest, NUM_DRAFTS, capture=False)
    for bucket in graphs.sizes:
        with recorder.step(f"draft graph {bucket}"), graph_steps():
            graphs.inputs.fill(draft_inputs(kv, bucket, longest // 2), bucket)
            graphs._forward(bucket)


def record_assistant(path: Path, platform: Platform) -> Launches:
    """(workload, launch) of every Triton launch speculative decoding with the assistant at path makes beside its
    target (the folder of the same name without -assistant): the target's verify steps and the draft rounds."""
    target = path.with_name(path.name.removesuffix(ASSISTANT_SUFFIX))
    config = EngineConfig(model=str(target), device="cpu", block_size=platform.block_size, speculative_config=dict(
        method="mtp", model=str(path), num_speculative_tokens=NUM_DRAFTS))
    spec = assistant_spec_for(config)
    model = _loaded(construct_model(config, META, platform), platform)
    with dispatch.use(platform, config.kernel_backend):
        assistant = mtp_assistant(config.model_spec.architecture).construct_assistant(
            spec, model, META, config.torch_dtype, config.max_model_len)
    _loaded(assistant, platform)
    recorder = _Recorder(platform, path.name)
    for dtype in _kv_dtypes(config, platform):
        kv = KVCacheManager(model.kv_specs(dtype), NUM_PAGES, config.block_size, META)
        runner = ModelRunner(model, kv, META)
        runner.keep_hidden = True
        recorder.label = f"{path.name} kv {str(dtype).removeprefix('torch.')}"
        _verify_steps(recorder, model, runner, kv, config)
        _draft_rounds(recorder, AssistantDrafter(assistant, kv, META), kv, config)
    return recorder.launches


def record(platform: Platform, models: list[Path] | None = None) -> Launches:
    """(workload, launch) for every model (default: every config of examples/configs)."""
    paths = [Path(path) for path in models or example_configs()]
    return [launch for path in paths for launch in
            (record_assistant if path.name.endswith(ASSISTANT_SUFFIX) else record_model)(path, platform)]
