"""Triton paged attention equals torch_ref.paged_attention (CPU: interpreter; GPU: compiled)."""
import pytest
import torch

from atomlite.model_ops import torch_ref
from atomlite.model_ops.triton.attention import paged as tri

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NULL_BLOCK = 0


def paged_batch(q_lens: list[int], k_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
                block_size: int, dtype: torch.dtype, window: int | None = None, device: str = "cpu",
                seed: int = 0):
    """Random q and caches. Block 0 is the null block (all NaN): unused block-table entries and blocks wholly
    before the window point at it. Cache slots past each sequence's length are NaN too."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [(k + block_size - 1) // block_size for k in k_lens]
    num_blocks = 1 + sum(blocks_per_seq)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen)
    v_cache = torch.randn(shape, generator=gen)
    physical = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    max_blocks = max(blocks_per_seq + [1]) + 1
    block_table = torch.full((len(k_lens), max_blocks), NULL_BLOCK, dtype=torch.int32)
    for b, (q_len, k_len) in enumerate(zip(q_lens, k_lens)):
        mine = [physical.pop() for _ in range(blocks_per_seq[b])]
        for slot in range(k_len, len(mine) * block_size):
            k_cache[mine[slot // block_size], slot % block_size] = float("nan")
            v_cache[mine[slot // block_size], slot % block_size] = float("nan")
        first_needed = 0 if window is None else max(0, k_len - q_len - window + 1)
        for i, block in enumerate(mine):
            if i >= first_needed // block_size:
                block_table[b, i] = block
    k_cache[NULL_BLOCK] = float("nan")
    v_cache[NULL_BLOCK] = float("nan")
    q = torch.randn((sum(q_lens), num_heads, head_dim), generator=gen)
    starts = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq_lens = torch.tensor(k_lens, dtype=torch.int32)
    to = dict(device=device)
    return (q.to(dtype).to(**to), k_cache.to(dtype).to(**to), v_cache.to(dtype).to(**to), block_table.to(**to),
            seq_lens.to(**to), starts.to(**to))


# Each batch mixes an empty sequence, a first token, a decode step, a prefix hit / later chunk (Lq < Lk) and a
# whole prefill.
Q_LENS, K_LENS = [0, 1, 1, 7, 20], [5, 1, 37, 40, 20]


def assert_close_to_reference(out, lse, args, scale, window, **options):
    """options: the op's keywords (key_ends, ...), for the reference too."""
    upcast = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    ref_out, ref_lse = torch_ref.paged_attention(*upcast, scale, window, True, **options)
    assert not out.isnan().any()
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=2e-5)
    elif DEVICE == "cpu":
        # One bf16 rounding of an fp32 result: within one ulp (the interpreter truncates on store).
        err = (out.float() - ref_out).abs()
        assert (err <= ref_out.abs() * 2.0 ** -7 * 1.01 + 1e-5).all(), err.max()
    else:
        # Compiled kernels also round P to bf16 before the PV product.
        torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=2e-2)
    if lse is not None:
        torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("head_dim,num_heads,num_kv_heads,block_size,window,dtype,return_lse", [
    (64, 2, 2, 16, None, torch.float32, True),
    (64, 4, 2, 16, 8, torch.bfloat16, True),  # window smaller than a block; 64-key tiles span null blocks
    (256, 8, 1, 16, 40, torch.float32, True),  # GQA 8, window larger than a block
    (256, 4, 2, 64, None, torch.bfloat16, False),
    (512, 4, 2, 32, None, torch.float32, True),
    (512, 8, 1, 16, 24, torch.bfloat16, True),
    (64, 8, 1, 128, 100, torch.bfloat16, True),
])
def test_paged_attention_matches_reference(head_dim, num_heads, num_kv_heads, block_size, window, dtype,
                                           return_lse):
    seed = torch.randint(0, 2**31, ()).item()
    args = paged_batch(Q_LENS, K_LENS, num_heads, num_kv_heads, head_dim, block_size, dtype, window, DEVICE, seed)
    result = tri.paged_attention(*args, head_dim ** -0.5, window, return_lse)
    out, lse = result if return_lse else (result, None)
    assert out.shape == args[0].shape and out.dtype == dtype
    assert_close_to_reference(out, lse, args, head_dim ** -0.5, window)


@pytest.mark.parametrize("group", [1, 2])
def test_many_query_tiles_per_sequence_match_reference(group):
    seed = torch.randint(0, 2**31, ()).item()
    args = paged_batch([33, 0, 18, 1], [40, 3, 50, 2], 2 * group, 2, 64, 16, torch.float32, 30, DEVICE, seed)
    config = tri.AttnConfig(block_m=8, block_n=16, num_warps=4, num_stages=1)
    out, lse = tri.launch(*args, 2.0, 30, True, config)  # a large scale makes row maxima jump often
    assert_close_to_reference(out, lse, args, 2.0, 30)


@pytest.mark.parametrize("splits,window", [(1, None), (1, 30), (3, None)])
def test_value_parts_match_reference(splits, window):
    """Two programs per query tile, each with half of the output columns: the same attention as one."""
    seed = torch.randint(0, 2**31, ()).item()
    args = paged_batch([33, 0, 18, 1], [40, 3, 50, 2], 4, 2, 64, 16, torch.float32, window, DEVICE, seed)
    config = tri.AttnConfig(block_m=8, block_n=16, num_warps=4, num_stages=1, num_splits=splits, value_parts=2)
    out, lse = tri.launch(*args, 0.125, window, True, config)
    assert_close_to_reference(out, lse, args, 0.125, window)


def test_strided_query_view_matches_reference():
    seed = torch.randint(0, 2**31, ()).item()
    q, *rest = paged_batch(Q_LENS, K_LENS, 4, 2, 64, 16, torch.float32, None, DEVICE, seed)
    qkv = torch.randn(q.shape[0], 8, 64, device=DEVICE)
    qkv[:, :4] = q
    args = (qkv[:, :4], *rest)
    out = tri.paged_attention(*args, 0.125)
    assert_close_to_reference(out, None, args, 0.125, None)


@pytest.mark.parametrize("window", [None, 48])
def test_split_kv_matches_reference(window):
    seed = torch.randint(0, 2**31, ()).item()
    args = paged_batch([1, 5, 1], [130, 70, 9], 4, 2, 64, 16, torch.float32, window, DEVICE, seed)
    config = tri.AttnConfig(block_m=16, block_n=16, num_warps=4, num_stages=1, num_splits=3)
    out, lse = tri.launch(*args, 0.125, window, True, config)
    assert_close_to_reference(out, lse, args, 0.125, window)


def test_decode_batch_picks_split_kv_and_matches_reference():
    seed = torch.randint(0, 2**31, ()).item()
    args = paged_batch([1, 1, 1], [700, 2, 161], 8, 1, 256, 32, torch.bfloat16, None, DEVICE, seed)
    config = tri.pick_config(args[0], args[1], args[3], group=8)
    assert config.num_splits > 1
    out, lse = tri.paged_attention(*args, 0.0625, None, True)
    assert_close_to_reference(out, lse, args, 0.0625, None)


def test_decode_config_walks_few_tiles_unpipelined():
    q = torch.empty(1, 16, 256, dtype=torch.bfloat16)
    cache = torch.empty(1, 16, 8, 256, dtype=torch.bfloat16)
    short_table, long_table = torch.empty(1, 64, dtype=torch.int32), torch.empty(1, 2048, dtype=torch.int32)
    short = tri.pick_config(q, cache, short_table, group=2)  # 1024 keys
    long = tri.pick_config(q, cache, long_table, group=2)  # 32768 keys
    windowed = tri.pick_config(q, cache, long_table, group=2, window=1024)
    assert short.num_splits == long.num_splits == 16
    assert (short.num_stages, long.num_stages, windowed.num_stages) == (1, 2, 1)
    assert windowed.num_splits == 16  # a 1024-key window still fills the splits


def test_wide_heads_split_beyond_16_only_one_program_per_multiprocessor():
    """Global layers (512-wide heads): up to 32 splits, beyond 16 only while the programs fit one per multiprocessor
    (132 off the GPU), so 2 or 4 KV heads take 32 splits and 8 keep 16; 256-wide heads stop at 16."""
    table = torch.empty(1, 256, dtype=torch.int32)  # 4096 keys in blocks of 16

    def splits(kv_heads: int, head_dim: int) -> int:
        q = torch.empty(1, 16, head_dim, dtype=torch.bfloat16)
        cache = torch.empty(1, 16, kv_heads, head_dim, dtype=torch.bfloat16)
        return tri.pick_config(q, cache, table, group=16 // kv_heads).num_splits

    assert [splits(kv, 512) for kv in (2, 4, 8)] == [32, 32, 16]
    assert splits(8, 256) == 16


def test_wide_heads_take_shared_tiles_when_programs_outnumber_multiprocessors(monkeypatch):
    """Global layers (512-wide bf16 heads, off the interpreter): batch 1's 16 splits of 4 KV heads (64 programs for
    132 multiprocessors) keep 64-key tiles on 8 warps; a batch of 128 (512 programs) takes DECODE_SHARED_WIDE_HEAD,
    unless a program holds a verify step's 5 queries (40 rows)."""
    from atomlite.model_ops.triton.attention.tuning import DECODE_SHARED_WIDE_HEAD
    monkeypatch.setattr(tri, "interpreting", lambda: False)
    cache = torch.empty(1, 16, 4, 512, dtype=torch.bfloat16)

    def config(num_seqs: int, query_len: int = 1) -> tri.AttnConfig:
        q = torch.empty(num_seqs * query_len, 32, 512, dtype=torch.bfloat16)
        table = torch.empty(num_seqs, 64, dtype=torch.int32)
        return tri.pick_config(q, cache, table, group=8, max_query_len=query_len)

    alone, loaded, verify = config(1), config(128), config(128, 5)
    assert (alone.block_n, alone.num_warps, alone.num_splits) == (64, 8, 16)
    assert (loaded.block_n, loaded.num_warps, loaded.num_stages) == DECODE_SHARED_WIDE_HEAD
    assert loaded.num_splits == 1
    assert (verify.block_m, verify.block_n, verify.num_warps) == (64, 64, 8)


def test_narrow_heads_take_eight_warps_only_where_each_program_has_a_multiprocessor(monkeypatch):
    """Sliding layers at batch 1, 16 splits: 8 KV heads (128 programs for 132 multiprocessors) take 8 warps, 16 KV
    heads (256 programs, two a multiprocessor) keep 4."""
    monkeypatch.setattr(tri, "interpreting", lambda: False)
    q, table = torch.empty(1, 32, 256, dtype=torch.bfloat16), torch.empty(1, 128, dtype=torch.int32)

    def config(kv_heads: int) -> tri.AttnConfig:
        cache = torch.empty(1, 16, kv_heads, 256, dtype=torch.bfloat16)
        return tri.pick_config(q, cache, table, group=32 // kv_heads, window=1024)

    assert [(c.num_splits, c.num_warps) for c in (config(8), config(16))] == [(16, 8), (16, 4)]


def test_attention_without_queries_returns_empty():
    args = paged_batch([0, 0], [3, 9], 2, 1, 64, 16, torch.float32, None, DEVICE)
    out, lse = tri.paged_attention(*args, 0.1, None, True)
    assert out.shape == (0, 2, 64) and lse.shape == (0, 2)


@pytest.mark.parametrize("period,head_dim", [(8, 64), (8, 256), (2, 64)])
def test_split_kv_merge_writes_the_output_quantized_as_the_fp8_gemm_reads_it(period, head_dim):
    """With quantize (K = H * D) the split-KV merge writes the [T, H * D] output as QuantizedRows: the fp8 GEMM's
    own quantization of the unquantized output, block for block; a K other than H * D leaves the output as is."""
    from atomlite.model_ops.carriers import InputQuantization, QuantizedRows
    from atomlite.model_ops.triton.mxfp4.fp8_tiles import quantize_activations
    args = paged_batch([1, 1], [130, 9], 4, 2, head_dim, 16, torch.bfloat16, None, DEVICE, seed=period)
    config = tri.AttnConfig(block_m=16, block_n=16, num_warps=4, num_stages=1, num_splits=3)
    out = tri.launch(*args, 0.125, None, False, config)
    form = InputQuantization(period, 4 * head_dim)
    quantized = tri.launch(*args, 0.125, None, False, config, quantize=form)
    values, scales = quantize_activations(out.flatten(1), form.k_padded, period)
    assert isinstance(quantized, QuantizedRows) and (quantized.rows, quantized.period) == (2, period)
    assert torch.equal(quantized.values.view(torch.uint8), values.view(torch.uint8))
    assert torch.equal(quantized.scales, scales)
    padded = InputQuantization(period, 4 * head_dim + 256)
    assert torch.equal(tri.launch(*args, 0.125, None, False, config, quantize=padded), out)


@pytest.mark.parametrize("group", [2, 8])
def test_verify_step_queries_take_split_kv_tiles_and_match_reference(group):
    """A verify step: each sequence's newest token and 4 drafts, the host's lengths known (an eager step) or not (a
    graph replay): split-KV tiles that hold a sequence's 5 queries x the GQA group in one program."""
    from atomlite.model_ops.context import HostBatch
    seed = torch.randint(0, 2**31, ()).item()
    q_lens, k_lens = [5, 5, 5], [300, 5, 77]
    args = paged_batch(q_lens, k_lens, 2 * group, 2, 64, 16, torch.float32, None, DEVICE, seed)
    starts = [0, 5, 10, 15]
    for host in (HostBatch.of(starts, k_lens), HostBatch(starts, None, 5, 320, False)):
        config = tri.pick_config(args[0], args[1], args[3], group, max_query_len=host.max_query_len)
        assert config.num_splits > 1 or DEVICE == "cpu"
        if DEVICE != "cpu":
            assert config.block_m >= min(64, 5 * group)
        out, lse = tri.paged_attention(*args, 0.125, None, True, host=host)
        assert_close_to_reference(out, lse, args, 0.125, None)
