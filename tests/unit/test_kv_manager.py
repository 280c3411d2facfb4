"""The KV cache manager on its own: how layer specs group and where their blocks lie in the one shared memory,
all-or-nothing allocation from the shared pages, sliding-window release, and prefix-cache hits and eviction, driven
by hand the way the engine drives it."""
import pytest
import torch

from atomlite.engine.kv.block_pool import NULL_BLOCK, BlockPool, PagePool
from atomlite.engine.images.seq_images import SeqItem
from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.sequence import Sequence
from atomlite.model_ops.kv_spec import KVSpec
from atomlite.sampling_params import SamplingParams

BLOCK = 4
FULL = KVSpec("full", 2, 4, torch.float32)
SLIDING = KVSpec("sliding", 2, 4, torch.float32, window=8)


def manager(specs, num_pages: int, prefix_caching: bool = True) -> KVCacheManager:
    return KVCacheManager(specs, num_pages, BLOCK, torch.device("cpu"), prefix_caching)


def seq(token_ids) -> Sequence:
    return Sequence(list(token_ids), SamplingParams(max_tokens=100))


def compute(kv: KVCacheManager, s: Sequence, num_new: int) -> None:
    """One engine step for s: blocks, then the tokens count as computed, keyed and released."""
    assert kv.allocate(s, num_new)
    s.num_computed_tokens += num_new
    kv.update_block_hashes(s)
    kv.release_out_of_window(s)


def test_equal_specs_share_one_pool():
    specs = [FULL, SLIDING, FULL, SLIDING, KVSpec("full", 2, 4, torch.bfloat16), KVSpec("shared", target=1)]
    kv = manager(specs, 5)
    # blocks of 512, 512 and 128 bytes: a page holds one of the first two groups' or four of the third's
    assert [(g.spec, g.layers, g.pool.per_page) for g in kv.groups] == [
        (FULL, [0, 2], 1), (SLIDING, [1, 3], 1), (specs[4], [4], 4)]
    assert [kv.cache_for_layer(layer)[2] for layer in range(6)] == [0, 1, 0, 1, 2, 1]
    assert kv.caches[0][1].shape == (5, BLOCK, 2, 4) and kv.caches[4][1].shape == (20, BLOCK, 2, 4)
    assert kv.caches[4][1].dtype == torch.bfloat16
    memory = kv.memory.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == memory for k, v in kv.caches.values() for t in (k, v))


def test_shared_layer_reads_its_targets_tensors_and_owns_none():
    kv = manager([FULL, SLIDING, KVSpec("shared", target=1)], 4)
    k, v, group = kv.cache_for_layer(2)
    target_k, target_v, target_group = kv.cache_for_layer(1)
    assert k is target_k and v is target_v and group == target_group
    assert 2 not in kv.caches and kv.groups[1].layers == [1]


def test_shared_layer_must_target_a_layer_that_owns_its_kv():
    with pytest.raises(ValueError, match="layer 2 shares layer 1"):
        manager([FULL, KVSpec("shared", target=0), KVSpec("shared", target=1)], 4)


@pytest.mark.parametrize("kwargs", [dict(kind="global"), dict(kind="sliding"), dict(kind="full", window=8),
                                    dict(kind="shared"), dict(kind="full", target=0)])
def test_kv_spec_rejects_inconsistent_fields(kwargs):
    with pytest.raises(ValueError):
        KVSpec(**kwargs)


def test_k_from_v_layers_store_one_tensor():
    v_only = KVSpec("full", 2, 4, torch.float32, k_from_v=True)
    kv = manager([FULL, v_only], 4)
    assert len(kv.groups) == 2  # same shape, but a V-only cache cannot serve a layer that reads K
    k, v, _ = kv.cache_for_layer(1)
    assert k is None and v.shape == (4 * kv.groups[1].pool.per_page, BLOCK, 2, 4)
    assert kv.cache_for_layer(0)[0].shape == (4, BLOCK, 2, 4)
    assert 2 * v_only.bytes_per_token == FULL.bytes_per_token == 2 * 2 * 4 * 4


def test_block_pool_never_hands_out_the_null_blocks_page():
    pages = PagePool(4)
    assert sorted(BlockPool(pages).allocate() for _ in range(2)) == [1, 2] and pages.num_free == 1
    three_per_page = BlockPool(pages, 3)
    assert sorted(three_per_page.allocate() for _ in range(3)) == [9, 10, 11] and pages.num_free == 0
    with pytest.raises(ValueError, match="at least 2 pages"):
        PagePool(1)


def test_small_blocks_of_several_sequences_share_a_page_and_free_it_together():
    pages = PagePool(3)
    pool = BlockPool(pages, 2)
    a, b = pool.allocate(), pool.allocate()
    assert a // 2 == b // 2 and pages.num_free == 1 and pool.pages_needed(1) == 1
    pool.release(a)
    assert pages.num_free == 1 and pool.pages_needed(1) == 0  # a's block serves the next allocation
    pool.release(b)
    assert pages.num_free == 2 and pool.num_used == 0


def test_a_page_a_group_freed_serves_another_group():
    pages = PagePool(2)
    big, small = BlockPool(pages), BlockPool(pages, 4)
    big.release(big.allocate())
    assert [small.allocate() for _ in range(4)] == [4, 5, 6, 7] and pages.num_free == 0


def test_a_cached_block_of_a_free_page_is_taken_back_with_its_page():
    pages = PagePool(3)
    pool = BlockPool(pages, 2)
    block = pool.allocate()
    pool.register(block, b"key", (b"parent", (1, 2)))
    pool.release(block)
    assert pages.num_free == 2
    assert pool.take_cached(b"key", (b"parent", (1, 2))) == block and pages.num_free == 1
    assert pool.allocate() == block ^ 1  # the page's other block, before a new page


def test_handing_a_page_to_another_group_evicts_its_cached_blocks():
    pages = PagePool(2)
    first, second = BlockPool(pages), BlockPool(pages)
    block = first.allocate()
    first.register(block, b"key", (b"parent", ()))
    first.release(block)
    second.allocate()
    assert first.find(b"key", (b"parent", ())) is None


def test_no_two_held_blocks_of_any_layers_overlap_in_memory():
    """Fill every page with blocks of mixed groups, write a distinct value through each layer's view of each
    held block, and read every one back unchanged."""
    specs = [FULL, SLIDING, KVSpec("full", 1, 4, torch.bfloat16), KVSpec("full", 2, 8, torch.float32,
                                                                            k_from_v=True)]
    kv = manager(specs, 9)
    held = []
    for i in range(64):
        group = kv.groups[i % len(kv.groups)]
        if group.pool.pages_needed(1) <= kv.pages.num_free:
            held.append((group, group.pool.allocate()))
    assert kv.pages.num_free == 0
    views = [(group, t) for group in kv.groups for layer in group.layers for t in kv.caches[layer] if t is not None]
    for n, (group, t) in enumerate(views):
        for block in [b for g, b in held if g is group]:
            t[block] = n * 1000 + block
    for n, (group, t) in enumerate(views):
        for block in [b for g, b in held if g is group]:
            assert torch.all(t[block] == n * 1000 + block)


def test_allocation_is_all_or_nothing_across_groups():
    kv = manager([FULL, SLIDING], 5)  # 4 pages, each one block of either group
    s = seq(range(12))
    assert not kv.allocate(s, 12)  # 3 blocks in each group
    assert kv.pages.num_free == 4 and kv.blocks_allocated(s) == [0, 0]
    assert kv.allocate(s, 8)
    assert kv.blocks_allocated(s) == [2, 2]


def test_sliding_layer_group_keeps_only_window_blocks():
    kv = manager([FULL, SLIDING], 32)
    full, sliding = kv.groups
    s = seq(range(10))
    compute(kv, s, 10)
    while s.num_computed_tokens < 59:
        s.token_ids.append(1)
        compute(kv, s, 1)
        assert sliding.pool.num_used <= SLIDING.blocks_held(59, BLOCK) == 3
    assert full.pool.num_used == 15 == len(s.block_tables[full.id])
    table = s.block_tables[sliding.id]
    first_needed = 13  # a query at position 59 sees keys 52..59: blocks 13 and 14
    assert list(table)[:first_needed] == [NULL_BLOCK] * first_needed
    assert NULL_BLOCK not in list(table)[first_needed:]
    assert kv.blocks_allocated(s) == [15, len(table) - first_needed]


def test_freeing_a_sequence_returns_every_block_in_every_group():
    kv = manager([FULL, SLIDING], 40)
    s = seq(range(70))  # more blocks than a block table's initial capacity
    compute(kv, s, 70)
    kv.free(s)
    assert kv.pages.num_free == 39
    assert all(refs == 0 for g in kv.groups for refs in g.pool.refs)
    assert s.block_tables == [] and kv.blocks_allocated(s) == [0, 0]


def test_prefix_hit_reuses_blocks_and_counts_cached_tokens():
    kv = manager([FULL], 16)
    a = seq(range(14))
    compute(kv, a, 14)
    b = seq(list(range(12)) + [99, 98])
    assert kv.apply_prefix_hit(b) == 12
    assert b.num_computed_tokens == b.num_cached_tokens == 12
    assert list(b.block_tables[0]) == list(a.block_tables[0])[:3]
    assert kv.pages.num_free == 16 - 1 - 4  # nothing new was taken


def test_prefix_hit_always_leaves_the_last_prompt_token_to_compute():
    kv = manager([FULL], 16)
    a = seq(range(8))
    compute(kv, a, 8)
    assert kv.apply_prefix_hit(seq(range(8))) == 4  # 8 cached tokens would leave nothing to sample from
    assert kv.apply_prefix_hit(seq(range(9))) == 8


def test_a_block_hits_only_after_the_same_prefix():
    kv = manager([FULL], 16)
    compute(kv, seq(range(12)), 12)
    assert kv.apply_prefix_hit(seq([50, 51, 52, 53] + list(range(4, 12)) + [0])) == 0


def test_freed_blocks_stay_cached_until_new_allocations_evict_them():
    """A new allocation takes never-used and unkeyed blocks before cached ones, and evicts a prefix from its tail
    (a sequence frees its blocks last first), so the head of the prefix keeps hitting longest."""
    for new_blocks, hit in [(4, 8), (5, 4), (6, 0)]:
        kv = manager([FULL], 7)  # 6 usable blocks
        a = seq(range(9))
        compute(kv, a, 9)  # 3 blocks: 2 full and keyed, 1 partial
        kv.free(a)
        assert kv.allocate(seq(range(100, 100 + BLOCK * new_blocks)), BLOCK * new_blocks)
        assert kv.apply_prefix_hit(seq(range(9))) == hit, new_blocks


def test_freed_blocks_without_a_key_are_reused_before_cached_ones():
    kv = manager([FULL], 5)  # 4 usable blocks
    a, b = seq(range(9)), seq(range(100, 103))
    compute(kv, a, 9)  # 2 keyed blocks and a partial one
    compute(kv, b, 3)  # one partial block, freed after a's
    kv.free(a)
    kv.free(b)
    assert kv.allocate(seq(range(200, 208)), 8)
    assert kv.apply_prefix_hit(seq(range(9))) == 8


def test_sliding_group_prefix_hit_needs_only_blocks_in_the_window():
    """a's first sliding blocks were released while a ran; a 16-token hit needs only blocks 2 and 3 there (a query
    at 16 sees keys 9..16) and takes null entries for the rest."""
    kv = manager([FULL, SLIDING], 16)
    full, sliding = kv.groups
    a = seq(range(17))
    for num_new in [4, 4, 4, 4, 1]:
        compute(kv, a, num_new)
    b = seq(list(range(16)) + [90, 91])
    assert kv.apply_prefix_hit(b) == 16
    first_needed = (16 - 8 + 1) // BLOCK
    assert list(b.block_tables[sliding.id])[:first_needed] == [NULL_BLOCK] * first_needed
    assert list(b.block_tables[sliding.id])[first_needed:] == list(a.block_tables[sliding.id])[first_needed:4]
    assert list(b.block_tables[full.id]) == list(a.block_tables[full.id])[:4]


def test_prefix_hit_stops_where_any_group_lost_the_block():
    kv = manager([FULL, KVSpec("full", 4, 4, torch.bfloat16)], 16)  # blocks of one size: one a page
    a = seq(range(9))
    compute(kv, a, 9)
    second = kv.groups[1]
    evicted = a.block_tables[second.id][1]
    kv.free(a)
    second.pool.forget_page(evicted // second.pool.per_page)  # as when the page pool hands that page out
    b = seq(range(9))
    assert kv.apply_prefix_hit(b) == 4
    assert kv.blocks_allocated(b) == [1, 1]


def longest_servable_hit(kv: KVCacheManager, s: Sequence) -> int:
    """The definition apply_prefix_hit must meet, by brute force: the most full blocks (leaving the last token)
    that every group holds from its first needed block on."""
    last_full = (len(s.token_ids) - 1) // BLOCK
    keys = kv._extend_keys(s, last_full)
    for hit in range(last_full, 0, -1):
        inside_image = any(image.offset < hit * BLOCK < image.end for image in s.images)
        if not inside_image and all(g.pool.find(keys[i], kv._identity(s, keys, i)) is not None
                                    for g in kv.groups for i in range(g.first_needed_block(hit * BLOCK, BLOCK), hit)):
            return hit * BLOCK
    return 0


def image(offset: int, length: int, content: bytes = b"a") -> SeqItem:
    return SeqItem(offset, length, content, "image", ())


def random_images(g: torch.Generator, length: int) -> list[SeqItem]:
    """Up to three images in a prompt of `length`, of 1-9 tokens, 0-4 apart (less than a block, often), each one
    of two contents."""
    images, at = [], int(torch.randint(0, 6, (1,), generator=g))
    while len(images) < 3:
        size = int(torch.randint(1, 10, (1,), generator=g))
        if at + size > length:
            break
        images.append(image(at, size, (b"a", b"b")[int(torch.randint(0, 2, (1,), generator=g))]))
        at += size + int(torch.randint(0, 5, (1,), generator=g))
    return images


@pytest.mark.parametrize("specs,with_images", [([FULL, SLIDING], False), ([SLIDING], False), ([FULL], False),
                                               ([FULL, SLIDING], True)])
def test_prefix_hit_is_the_longest_every_group_can_serve(specs, with_images):
    """Prompts sharing prefixes of random lengths, run in pieces and freed while a small pool evicts: each hit is
    the brute-force longest one, sliding groups having released and lost blocks their windows no longer need; with
    images, no hit ends inside one."""
    g = torch.Generator().manual_seed(0)
    kv = manager(specs, 24)
    base = torch.randint(0, 50, (40,), generator=g).tolist()
    for trial in range(300 if with_images else 60):
        shared = int(torch.randint(0, 40, (1,), generator=g))
        tail = torch.randint(50, 99, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        s = seq(base[:shared] + tail)
        if with_images:
            s.images = random_images(g, len(s.token_ids))
        expected = longest_servable_hit(kv, s)
        assert kv.apply_prefix_hit(s) == expected, trial
        remaining = len(s.token_ids) - s.num_computed_tokens
        if not kv.allocate(s, remaining):
            kv.free(s)
            continue
        for step in (remaining // 2, remaining - remaining // 2):
            s.num_computed_tokens += step
            kv.update_block_hashes(s)
            kv.release_out_of_window(s)
        kv.free(s)


def test_a_hit_rounded_down_into_an_earlier_image_goes_back_to_that_image_too():
    """Images at [2, 9) and [10, 13), blocks of 4: a hit of 12 tokens ends inside the second image, whose start
    rounds down to 8, inside the first: no hit."""
    kv = manager([FULL], 16)
    s = seq(range(14))
    s.images = [image(2, 7), image(10, 3)]
    assert kv._hit_outside_images(s, 3) == 0


def test_prefix_caching_off_never_hits():
    kv = manager([FULL], 16, prefix_caching=False)
    a = seq(range(14))
    compute(kv, a, 14)
    b = seq(range(14))
    assert kv.apply_prefix_hit(b) == 0 and b.num_cached_tokens == 0
    kv.free(a)
    assert kv.pages.num_free == 15

