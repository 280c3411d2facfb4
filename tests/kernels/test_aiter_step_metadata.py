"""An AITER step takes the batch's lengths from the host and plans its prefill gather once per KV group, not once per
layer, and nothing in it reads a batch tensor back from the device (a host sync on a GPU).

A stack of attention layers (two KV groups and a KV-sharing layer) is driven by the model runner through prefill
chunks, a mixed step and a decode step, on the stand-in `aiter` of test_aiter_contract.py, and compared with the same
stack on the torch reference. On this CPU machine "device" tensors are the context's tensors, wrapped so that any
host read of them fails while the layers run (the stand-in kernels themselves may read: on a GPU they run there).
"""
import dataclasses

import pytest
import torch
from torch import nn

from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.model_ops.kv_spec import KVSpec
from atomlite.engine.runner.model_runner import ModelRunner
from atomlite.engine.sequence import Sequence
from atomlite.model_ops import dispatch
from atomlite.model_ops.aiter import detect, functions as F, gather
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.context import ForwardContext
from atomlite.model_ops.platform import Platform
from atomlite.sampling_params import SamplingParams
from test_aiter_contract import install_stand_in
from test_aiter_semantics import SEMANTICS

GFX950 = Platform("rocm", "gfx950", has_aiter=True)
HEADS, KV_HEADS, HEAD_DIM, BLOCK, WINDOW, VOCAB, MAX_LEN = 4, 2, 64, 16, 8, 50, 64
SLIDING = KVSpec("sliding", KV_HEADS, HEAD_DIM, torch.bfloat16, window=WINDOW)
FULL = KVSpec("full", KV_HEADS, HEAD_DIM, torch.bfloat16)
SPECS = [SLIDING, FULL, SLIDING, FULL, KVSpec("shared", target=2)]
WINDOWS = [WINDOW, None, WINDOW, None, WINDOW]
HOST_READS = {"tolist", "item", "numpy", "cpu", "__int__", "__float__", "__bool__", "__index__"}


class DeviceOnly(torch.Tensor):
    """A batch tensor as it sits on a GPU: while armed, reading it on the host fails."""
    armed = False

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if cls.armed and getattr(func, "__name__", "") in HOST_READS:
            raise AssertionError(f"a layer read a batch tensor back to the host ({func.__name__})")
        return super().__torch_function__(func, types, args, kwargs or {})


def on_device(ctx: ForwardContext) -> ForwardContext:
    wrap = lambda t: t.as_subclass(DeviceOnly)  # noqa: E731
    groups = {gid: dataclasses.replace(g, slot_mapping=wrap(g.slot_mapping), block_table=wrap(g.block_table))
              for gid, g in ctx.groups.items()}
    return dataclasses.replace(ctx, positions=wrap(ctx.positions), query_start_loc=wrap(ctx.query_start_loc),
                               seq_lens=wrap(ctx.seq_lens), groups=groups)


def kernel_reads_allowed(fn):
    def run(**kwargs):
        armed, DeviceOnly.armed = DeviceOnly.armed, False
        try:
            return fn(**kwargs)
        finally:
            DeviceOnly.armed = armed
    return run


class AttentionStack(nn.Module):
    """Attention layers over fixed per-token q/k/v: the model the runner drives here. Keeps each step's outputs."""

    def __init__(self, prefer: str, guard: bool):
        super().__init__()
        with dispatch.use(GFX950, prefer):
            self.layers = nn.ModuleList(Attention(HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM ** -0.5, w) for w in WINDOWS)
        self.qkv = torch.randn(len(SPECS), 3, VOCAB, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0))
        self.qkv = self.qkv.bfloat16()
        self.guard, self.outputs, self.contexts = guard, [], []

    def attention_layers(self) -> list[Attention]:
        return list(self.layers)

    def forward(self, ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        self.contexts.append(ctx)
        ctx = on_device(ctx) if self.guard else ctx
        DeviceOnly.armed = self.guard
        try:
            self.outputs.append(torch.stack([self._layer(i, ids, ctx) for i in range(len(SPECS))]))
        finally:
            DeviceOnly.armed = False
        return torch.zeros(ids.shape[0], 1)

    def _layer(self, i: int, ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = (self.qkv[i, j][ids] for j in range(3))
        k, v = (None, None) if SPECS[i].kind == "shared" else (k[:, :KV_HEADS], v[:, :KV_HEADS])
        return self.layers[i](q, k, v, ctx).as_subclass(torch.Tensor)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


# Tokens per step for sequences of 29 and 7 prompt tokens: prefill chunks, a chunk beside a decode, a decode step.
STEPS = ([20, 7], [9, 1], [1, 1])


def run_steps(prefer: str, guard: bool, static_decode: bool) -> AttentionStack:
    model = AttentionStack(prefer, guard)
    kv = KVCacheManager(SPECS, 48, BLOCK, torch.device("cpu"), enable_prefix_caching=False)
    runner = ModelRunner(model, kv, torch.device("cpu"))
    if static_decode:
        runner.use_decode_graphs(max_batch=4, max_model_len=MAX_LEN, capture=False)
    prompts = ([3 + (i * 7) % 40 for i in range(29)], [5, 9, 11, 2, 8, 13, 4])
    seqs = [Sequence(prompt, SamplingParams()) for prompt in prompts]
    for counts in STEPS:
        batch = list(zip(seqs, counts))
        for seq, n in batch:
            assert kv.allocate(seq, n)
        runner.execute(batch)
        for seq, n in batch:
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == len(seq.token_ids):
                seq.token_ids.append(17)
    return model


@pytest.fixture
def stand_in_aiter(monkeypatch):
    monkeypatch.setattr(detect, "local_platform", lambda: None)  # layers are built for GFX950, not for this machine
    for path, fn in list(SEMANTICS.items()):
        monkeypatch.setitem(SEMANTICS, path, kernel_reads_allowed(fn))
    return install_stand_in(monkeypatch, detect.pinned()[detect.ASSUMED_VERSION]["functions"])


@pytest.mark.parametrize("static_decode", [False, True])
def test_aiter_step_plans_each_groups_gather_once_and_reads_nothing_back(stand_in_aiter, monkeypatch,
                                                                        static_decode):
    plans, plan_gather = [], gather.plan_gather
    monkeypatch.setattr(gather, "plan_gather", lambda *args: plans.append(args) or plan_gather(*args))
    got = run_steps("auto", guard=True, static_decode=static_decode)
    want = run_steps("torch", guard=False, static_decode=static_decode)
    for step, (g, w) in enumerate(zip(got.outputs, want.outputs)):
        torch.testing.assert_close(g.float(), w.float(), atol=3e-2, rtol=2e-2, msg=f"step {step}")
    assert len(plans) == 2 * len(STEPS[:2])  # each KV group in each prefill step; none when decoding
    calls = [(path, kw) for path, _, kw in stand_in_aiter]
    layers = lambda attend: [F.WRITE_KV_NHD, attend] * 4 + [attend]  # noqa: E731 (the KV-sharing layer writes none)
    assert [path for path, _ in calls] == layers(F.FLASH_VARLEN) * 2 + layers(F.PAGED_DECODE)
    # Decoding from static buffers must not size the kernel's work from one step's data: the table bounds it.
    bounds = {kw["max_context_len"] for path, kw in calls if path == F.PAGED_DECODE}
    assert bounds == ({MAX_LEN} if static_decode else {30})


def test_runner_fills_the_host_lengths_once_per_step(stand_in_aiter):
    hosts = [ctx.host for ctx in run_steps("auto", guard=False, static_decode=False).contexts]
    assert [h.query_starts for h in hosts] == [[0, 20, 27], [0, 9, 10], [0, 1, 2]]
    assert [h.seq_lens for h in hosts] == [[20, 7], [29, 8], [30, 9]]
    assert [(h.max_query_len, h.max_seq_len, h.decode_only) for h in hosts] == [(20, 20, False), (9, 29, False),
                                                                              (1, 30, True)]


def test_static_decode_context_knows_only_what_holds_for_every_step(stand_in_aiter):
    decode = run_steps("auto", guard=False, static_decode=True).contexts[-1]
    assert decode.host.seq_lens is None and decode.host.decode_only
    assert (decode.host.max_query_len, decode.host.max_seq_len) == (1, MAX_LEN)
    assert all(g.derived is None for g in decode.groups.values())  # replayed across steps: nothing may be kept
