"""Prefix-cache keys: collision-resistant, chained, and never trusted alone (a hit must match the block's tokens
and parent); sliding-window release touches each block once."""
import pytest
import torch

from atomlite import LLM
from atomlite.engine.kv.kv_cache import KVCacheManager, sha256_block_key
from atomlite.model_ops.kv_spec import KVSpec
from atomlite.engine.sequence import Sequence
from atomlite.sampling_params import SamplingParams
from helpers import greedy, random_prompt

BLOCK = 8


def colliding_block_key(parent_key: bytes, token_ids) -> bytes:
    return b"x"


@pytest.fixture(scope="module")
def uncached(random_model_dir):
    return LLM(str(random_model_dir), dtype="float32", device="cpu", block_size=BLOCK, enable_prefix_caching=False)


def cached_llm(path, block_key=None) -> LLM:
    llm = LLM(str(path), dtype="float32", device="cpu", block_size=BLOCK)
    if block_key is not None:
        llm.engine.kv.block_key = block_key
    return llm


def tokens(llm: LLM, prompt: list[int]):
    out = llm.generate([prompt], greedy(12))[0]
    return out.num_cached_tokens, out.outputs[0].token_ids


def test_colliding_key_never_serves_another_prompts_kv(random_model_dir, uncached):
    llm = cached_llm(random_model_dir, colliding_block_key)
    first, second = random_prompt(4 * BLOCK, seed=1), random_prompt(4 * BLOCK + 3, seed=2)
    tokens(llm, first)
    cached, output = tokens(llm, second)
    assert cached == 0
    assert output == tokens(uncached, second)[1]


def test_colliding_key_serves_only_blocks_whose_parent_and_tokens_match(random_model_dir, uncached):
    """Every key collides, so the pool indexes one block (the first prompt's first block): the second prompt may
    reuse that block, and must refuse it for its second block, whose tokens match but whose parent does not."""
    llm = cached_llm(random_model_dir, colliding_block_key)
    block = random_prompt(BLOCK, seed=3)
    tokens(llm, block * 4)
    cached, output = tokens(llm, block * 3 + random_prompt(5, seed=4))
    assert cached == BLOCK
    assert output == tokens(uncached, block * 3 + random_prompt(5, seed=4))[1]


def test_equal_prefixes_hit_and_give_uncached_tokens(random_model_dir, uncached):
    llm = cached_llm(random_model_dir)
    prefix = random_prompt(4 * BLOCK, seed=5)
    tokens(llm, prefix + random_prompt(3, seed=6))
    prompt = prefix + random_prompt(5, seed=7)
    cached, output = tokens(llm, prompt)
    assert cached == 4 * BLOCK
    assert output == tokens(uncached, prompt)[1]


def test_block_key_covers_parent_tokens_and_kv_dtype():
    root = b"\0" * 32
    key = sha256_block_key(root, [1, 2, 3])
    assert len(key) == 32
    assert key != sha256_block_key(root, [1, 2, 4])
    assert key != sha256_block_key(sha256_block_key(root, [9]), [1, 2, 3])
    assert sha256_block_key(root, [2**40]) != sha256_block_key(root, [0])
    bf16 = kv_manager(torch.bfloat16)
    assert bf16.root_key == kv_manager(torch.bfloat16).root_key
    assert bf16.root_key != kv_manager(torch.float32).root_key
    assert bf16.root_key != kv_manager(torch.bfloat16, cache_salt="tenant-a").root_key


def kv_manager(dtype=torch.float32, window=8, num_blocks=64, **kwargs) -> KVCacheManager:
    specs = [KVSpec("sliding", 1, 4, dtype, window=window), KVSpec("full", 1, 4, dtype)]
    return KVCacheManager(specs, 2 * num_blocks, block_size=4, device=torch.device("cpu"), **kwargs)


def test_sliding_release_frees_each_block_once_and_counts_stay_exact():
    kv = kv_manager(window=8)
    sliding, full = kv.groups
    seq = Sequence(list(range(3, 13)), SamplingParams(max_tokens=100))
    for num_new in [10] + [1] * 40:
        assert kv.allocate(seq, num_new)
        seq.num_computed_tokens += num_new
        kv.release_out_of_window(seq)
        seq.token_ids.append(7)
        held = len(seq.block_tables[sliding.id]) - sliding.first_needed_block(seq.num_computed_tokens, 4)
        assert sliding.pool.num_used == held <= 8 // 4 + 1
        assert full.pool.num_used == len(seq.block_tables[full.id])
        assert min(sliding.pool.refs) == 0 and max(sliding.pool.refs) == 1
    assert seq.released_until[sliding.id] == sliding.first_needed_block(seq.num_computed_tokens, 4) > 0
    kv.free(seq)
    seq.reset_for_recompute()
    assert seq.released_until == [] and sliding.pool.num_used == full.pool.num_used == 0
