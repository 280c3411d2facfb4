"""One builder makes every step's inputs: a decode step replayed from a graph reads what an eager step would, padded
to its bucket, and each KV group's attention metadata is built once per step, never kept in a replayed context."""
import pytest
import torch

from atomlite.engine.kv.block_pool import NULL_BLOCK
from atomlite.engine.runner.decode_graphs import StaticDecodeInputs
from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.runner.model_runner import ModelRunner
from atomlite.engine.sequence import Sequence
from atomlite.engine.runner.step_inputs import StepInputBuilder
from atomlite.model_ops.kv_spec import KVSpec
from atomlite.model_ops.triton.attention import paged as triton_attention
from atomlite.sampling_params import SamplingParams

BLOCK, MAX_LEN = 4, 64
SLIDING = KVSpec("sliding", 1, 8, torch.float32, window=6)
FULL_V_ONLY = KVSpec("full", 1, 8, torch.float32, k_from_v=True)
SPECS = [SLIDING, FULL_V_ONLY, SLIDING, KVSpec("shared", target=1)]
CPU = torch.device("cpu")


def kv_manager() -> KVCacheManager:
    return KVCacheManager(SPECS, 80, BLOCK, CPU, enable_prefix_caching=False)


def decoding(kv: KVCacheManager, lengths: list[int]) -> list[tuple[Sequence, int]]:
    """Sequences of these many tokens, all but the last computed: each adds its last token."""
    batch = []
    for i, length in enumerate(lengths):
        seq = Sequence([3 + (i + j) % 50 for j in range(length)], SamplingParams())
        assert kv.allocate(seq, length)
        seq.num_computed_tokens = length - 1
        batch.append((seq, 1))
    return batch


def test_decode_graph_inputs_are_the_eager_inputs_padded_to_the_bucket():
    kv = kv_manager()
    builder = StepInputBuilder(kv, CPU, {})
    batch = decoding(kv, [9, 3, 14])
    ids, eager = builder.context(builder.build(batch))
    static = StaticDecodeInputs(builder, max_batch=8, max_model_len=MAX_LEN)
    static.fill(builder.build(batch), bucket=4)
    replayed = static.context(4)
    n = len(batch)
    assert ids.tolist() == [seq.token_ids[-1] for seq, _ in batch] == static.ids[0][:n].tolist()
    assert eager.positions.tolist() == [8, 2, 13] == replayed.positions[:n].tolist()
    assert eager.seq_lens.tolist() == [9, 3, 14] == replayed.seq_lens[:n].tolist()
    for gid, group in eager.groups.items():
        width = group.block_table.shape[1]
        assert torch.equal(replayed.groups[gid].block_table[:n, :width], group.block_table)
        assert torch.equal(replayed.groups[gid].slot_mapping[:n], group.slot_mapping)
    # the padding row reads token 0 at position 0, stores nothing and sees one key of the null block
    assert (static.ids[0][n].item(), replayed.positions[n].item(), replayed.seq_lens[n].item()) == (0, 0, 1)
    assert all(g.slot_mapping[n].item() == -1 and g.block_table[n, 0].item() == NULL_BLOCK
               for g in replayed.groups.values())


def test_eager_inputs_of_a_prefill_chunk_beside_a_decode():
    kv = kv_manager()
    builder = StepInputBuilder(kv, CPU, {})
    (decode, _), = decoding(kv, [6])
    chunk = Sequence(list(range(10, 21)), SamplingParams())
    assert kv.allocate(chunk, 11)
    chunk.num_computed_tokens = 4  # a later chunk: positions 4..10
    inputs = builder.build([(decode, 1), (chunk, 7)])
    assert inputs.ids.tolist() == [decode.token_ids[5]] + list(range(14, 21))
    assert inputs.positions.tolist() == [5, 4, 5, 6, 7, 8, 9, 10]
    assert (inputs.query_starts, inputs.seq_lens) == ([0, 1, 8], [6, 11])
    for g, (slots, table) in enumerate(zip(inputs.slots, inputs.tables)):
        blocks = [decode.block_tables[g][5 // BLOCK]] + [chunk.block_tables[g][p // BLOCK] for p in range(4, 11)]
        assert slots.tolist() == [b * BLOCK + p % BLOCK for b, p in zip(blocks, inputs.positions.tolist())]
        assert table[0, len(decode.block_tables[g]):].tolist() == [NULL_BLOCK] * (table.shape[1] - 2)


class AttentionStub:
    """An attention layer as the runner sees it: its kernel's per-step metadata function, and its cache binding."""

    def __init__(self, kernel):
        self.step_metadata = getattr(kernel, "step_metadata", None)

    def bind_cache(self, k_cache, v_cache, group_id):
        self.group_id = group_id


class StubModel:
    def __init__(self, kernel):
        self.layers = [AttentionStub(kernel) for _ in SPECS]
        self.contexts = []

    def attention_layers(self):
        return self.layers

    def __call__(self, ids, ctx):
        self.contexts.append(ctx)
        return torch.zeros(ids.shape[0], 1)

    def compute_logits(self, hidden):
        return hidden


def kernel_with_metadata(calls: list):
    def kernel(*args, **kwargs):
        raise AssertionError("the stub model never attends")

    def step_metadata(ctx, group, spec, block_size):
        calls.append((spec, block_size))
        return ("metadata of", spec.kind, tuple(ctx.host.seq_lens or ()))
    kernel.step_metadata = step_metadata
    return kernel


def test_step_metadata_is_built_once_per_kv_group_and_step():
    calls = []
    kv = kv_manager()
    model = StubModel(kernel_with_metadata(calls))
    runner = ModelRunner(model, kv, CPU)
    runner.execute(decoding(kv, [5, 7]))
    assert calls == [(SLIDING, BLOCK), (FULL_V_ONLY, BLOCK)]  # two groups (the shared layer reads group 1)
    groups = model.contexts[-1].groups
    assert [groups[g].derived for g in (0, 1)] == [("metadata of", "sliding", (5, 7)), ("metadata of", "full", (5, 7))]


def test_a_decode_graph_refuses_metadata_it_would_replay_from_another_step():
    kv = kv_manager()
    runner = ModelRunner(StubModel(kernel_with_metadata([])), kv, CPU)
    graphs = runner.use_decode_graphs(max_batch=4, max_model_len=MAX_LEN, capture=False)
    with pytest.raises(RuntimeError, match="graph replay would reuse"):
        graphs.run(runner.inputs.build(decoding(kv, [5])))


def test_triton_builds_key_row_starts_for_prefills_of_v_only_groups_only():
    kv = kv_manager()
    builder = StepInputBuilder(kv, CPU, {})
    seqs = [Sequence(list(range(3, 3 + n)), SamplingParams()) for n in (5, 9)]
    for seq in seqs:
        assert kv.allocate(seq, len(seq.token_ids))
    _, prefill = builder.context(builder.build([(seq, len(seq.token_ids)) for seq in seqs]))
    metadata = [triton_attention.step_metadata(prefill, prefill.groups[g], spec, BLOCK)
                for g, spec in ((0, SLIDING), (1, FULL_V_ONLY))]
    assert metadata[0] is None and metadata[1].tolist() == [0, 5]
    _, decode = builder.context(builder.build(decoding(kv, [4])))
    assert triton_attention.step_metadata(decode, decode.groups[1], FULL_V_ONLY, BLOCK) is None
