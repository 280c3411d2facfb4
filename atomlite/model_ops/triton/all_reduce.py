"""One-shot all-reduce over peer memory, for the small rows of decode steps, where a collective's latency, not its
bandwidth, sets the time, and on two ranks for a prefill graph's rows too (model_ops.peer_memory says why).

Every rank has mapped every other rank's buffer and signal pad (model_ops.peer_memory). Program p of each rank
copies its blocks of x (blocks p, p + MAX_PROGRAMS, ... of BLOCK elements) into its own buffer, raises its flag in
slot p of every rank's pad, waits until every rank's flag in its own pad's slot p is up, then sums the ranks' blocks
itself, in rank order (so every rank gets the same bits) in fp32, into x. A flag is the call's epoch, which program p
counts in `epochs`: it grows by one per call, on every rank alike, also across graph replays. Two buffer slots
alternate by epoch: a rank that is one call ahead writes the slot its peers are not reading (it passed this call's
barrier only after they all finished the last one). That holds because each block of a slot is always the same
program's, whatever the call's size; a pair's second tensor (PAIR) starts on a whole round of programs for that.
On two ranks a program writes its blocks into the peer's slot instead (PUSH) and sums its x with what the peer wrote
into its own: a rank one call ahead then writes the peer's other slot, which the peer finished reading a call ago.

The residual update's exchange of a decode step's rows (peer_rows_sum) is all latency. There each rank pushes its
rows into every peer's buffer, every value in a word with the call's tag, and reads only its own buffer, where the
tags say when a peer's words have landed: nothing waits on a round trip over the link (no flag, no fence, no load
from another GPU's memory).
"""
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import run_kernel
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.peer_memory import PeerMemory, pair_offset

BLOCK = 2048
MAX_PROGRAMS = 512  # signal slots per rank (model_ops.peer_memory.MAX_SIGNALS)
PUSH_TWO_RANKS = True  # on two ranks each program writes its blocks into the peer's slot (the kernel's PUSH)


@triton.jit
def meet(signals, program, epoch, RANK: tl.constexpr, WORLD: tl.constexpr):
    """The barrier of this call's program `program` on every rank: once the program's stores are done, raise its flag
    (the call's epoch) in every rank's pad, then wait until every rank's flag in this rank's pad is up."""
    tl.debug_barrier()  # the whole slice is stored before the flag says so
    for r in tl.static_range(WORLD):
        pad = tl.load(signals + r).to(tl.pointer_type(tl.int64))
        tl.atomic_xchg(pad + program * WORLD + RANK, epoch, sem="release", scope="sys")
    own = tl.load(signals + RANK).to(tl.pointer_type(tl.int64))
    for r in tl.static_range(WORLD):
        while tl.atomic_add(own + program * WORLD + r, 0, sem="acquire", scope="sys") < epoch:
            pass
    tl.debug_barrier()


@triton.jit
def _sum_over_ranks(x, buffers, at, offs, mask, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Elements at + offs of every rank's buffer, summed in rank order in fp32, stored into x + offs."""
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):
        peer = tl.load(buffers + r).to(tl.pointer_type(x.dtype.element_ty))
        total += tl.load(peer + at + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(x + offs, total.to(x.dtype.element_ty), mask=mask)


@triton.jit
def _sum_with_pushed(x, received, offs, mask, RANK: tl.constexpr, BLOCK: tl.constexpr):
    """Two ranks: x + offs and the peer's elements that it wrote at received + offs, summed in rank order in fp32,
    stored into x + offs."""
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(2):
        source = x if r == RANK else received
        total += tl.load(source + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(x + offs, total.to(x.dtype.element_ty), mask=mask)


@triton.jit
def _one_shot_all_reduce_kernel(x, y, buffers, signals, epochs, n, slot_elems, y_at, RANK: tl.constexpr,
                                WORLD: tl.constexpr, BLOCK: tl.constexpr, PAIR: tl.constexpr = False,
                                PUSH: tl.constexpr = False):
    """PAIR: y (n elements too) is summed alongside, its slice y_at elements after x's in the buffer slot. PUSH (two
    ranks): each program writes its blocks into the peer's slot, not its own, and after the barrier reads only its
    own buffer: the link carries writes, which wait on no round trip, and no local copy comes first."""
    pid, programs = tl.program_id(0), tl.num_programs(0)
    epoch = tl.load(epochs + pid) + 1
    slot = (epoch % 2) * slot_elems
    mine = tl.load(buffers + RANK).to(tl.pointer_type(x.dtype.element_ty))
    target = mine
    if PUSH:
        target = tl.load(buffers + (1 - RANK)).to(tl.pointer_type(x.dtype.element_ty))
    for start in range(pid * BLOCK, n, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(target + slot + offs, tl.load(x + offs, mask=mask, other=0.0), mask=mask)
        if PAIR:
            tl.store(target + slot + y_at + offs, tl.load(y + offs, mask=mask, other=0.0), mask=mask)
    meet(signals, pid, epoch, RANK, WORLD)
    for start in range(pid * BLOCK, n, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        if PUSH:
            _sum_with_pushed(x, mine + slot, offs, mask, RANK, BLOCK)
            if PAIR:
                _sum_with_pushed(y, mine + slot + y_at, offs, mask, RANK, BLOCK)
        else:
            _sum_over_ranks(x, buffers, slot, offs, mask, WORLD, BLOCK)
            if PAIR:
                _sum_over_ranks(y, buffers, slot + y_at, offs, mask, WORLD, BLOCK)
    tl.store(epochs + pid, epoch)


@triton.jit
def _tagged(values, tag, dtype: tl.constexpr):
    """values (fp32 holding dtype values) as words of twice dtype's width: the value's bits low, tag high."""
    # one return after both branches: a compiled kernel goes on past a return inside a constexpr branch
    if dtype.primitive_bitwidth == 32:
        words = (values.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (tag.to(tl.int64) << 32)
    else:
        bits = values.to(dtype).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        words = bits | ((tag.to(tl.int32) & 0xFFFF) << 16)
    return words


@triton.jit
def _untagged(words, dtype: tl.constexpr):
    """The fp32 values of words that _tagged wrote."""
    if dtype.primitive_bitwidth == 32:
        values = words.to(tl.int32).to(tl.float32, bitcast=True)
    else:
        values = (words & 0xFFFF).to(tl.int16).to(dtype, bitcast=True).to(tl.float32)
    return values


@triton.jit
def _arrived(at, cols, mask, tag, dtype: tl.constexpr):
    """The words at at + cols once every one (mask) carries tag: a peer's stores may land in any order."""
    shift: tl.constexpr = dtype.primitive_bitwidth
    low: tl.constexpr = (1 << shift) - 1
    expected = tag & low
    words = tl.load(at + cols, mask=mask, other=0, volatile=True)
    while tl.sum((((words >> shift) & low) != expected).to(tl.int32) * mask.to(tl.int32)) > 0:
        words = tl.load(at + cols, mask=mask, other=0, volatile=True)
    return words


@triton.jit
def peer_rows_sum(a, b, cols, mask, row, dim, buffers, epochs, slot_words, RANK: tl.constexpr, WORLD: tl.constexpr,
                  PAIR: tl.constexpr, dtype: tl.constexpr):
    """Rows a (and b with PAIR): this rank's shares of row `row`, fp32 holding dtype values; returns each summed over
    the WORLD ranks in rank order in fp32, rounded to dtype (what the one-shot all-reduce gives). The reading
    kernel's program `row` pushes its shares into every peer's buffer, each value in a word with the call's tag
    (the low bits of its epoch), and waits in its own buffer until every peer's words carry the tag: no flag, no
    fence, no read from another GPU. Region of source rank s in a buffer slot: [(row * WORLD + s) * 2 * dim, + 2 *
    dim), b's half after a's. Two slots alternate by epoch: a peer writes this slot again only two calls later,
    after this program has read it (the peer needs this rank's next call's words first). Only PAIR calls write b's
    half, so stale b words of a slot could pass for new ones if a row's PAIR calls on that slot were exactly a
    multiple of 2^16 epochs apart (16-bit dtypes); a MoE model's every layer makes one, so they never are."""
    WORD: tl.constexpr = tl.int64 if dtype.primitive_bitwidth == 32 else tl.int32
    epoch = tl.load(epochs + row) + 1
    slot = (epoch % 2) * slot_words
    words_a = _tagged(a, epoch, dtype)
    words_b = _tagged(b, epoch, dtype)
    sent = slot + (row * WORLD + RANK) * 2 * dim
    for r in tl.static_range(WORLD):
        if r != RANK:
            peer = tl.load(buffers + r).to(tl.pointer_type(WORD))
            tl.store(peer + sent + cols, words_a, mask=mask)
            if PAIR:
                tl.store(peer + sent + dim + cols, words_b, mask=mask)
    mine = tl.load(buffers + RANK).to(tl.pointer_type(WORD))
    total_a = tl.zeros_like(a)
    total_b = tl.zeros_like(b)
    for r in tl.static_range(WORLD):
        if r == RANK:
            total_a += a.to(dtype).to(tl.float32)
            total_b += b.to(dtype).to(tl.float32)
        else:
            received = mine + slot + (row * WORLD + r) * 2 * dim
            total_a += _untagged(_arrived(received, cols, mask, epoch, dtype), dtype)
            if PAIR:
                total_b += _untagged(_arrived(received + dim, cols, mask, epoch, dtype), dtype)
    tl.store(epochs + row, epoch)
    return total_a.to(dtype).to(tl.float32), total_b.to(dtype).to(tl.float32)


def programs_for(numel: int) -> int:
    """One BLOCK a program, up to MAX_PROGRAMS programs, which then take every MAX_PROGRAMS-th block each."""
    return min(MAX_PROGRAMS, triton.cdiv(numel, BLOCK))


def one_shot_all_reduce(x, buffers, signals, epochs, slot_elems: int, rank: int, world: int, y=None):
    """x (contiguous, at most slot_elems elements) summed over the ranks, in place; with y (x's shape and dtype,
    contiguous), y too, in the same exchange, its slice at peer_memory.pair_offset(n) in the slot.
    buffers, signals: int64 [world] device tensors of the ranks' buffer and pad addresses; epochs: this rank's int64
    [MAX_PROGRAMS] counters."""
    n = x.numel()
    y_at = 0 if y is None else pair_offset(n)
    # block b of the slot is always program b % MAX_PROGRAMS's (single calls and pairs alike, whatever n): a rank one
    # call ahead then writes only what its peers' same program has finished reading (the module docstring)
    if y_at % (MAX_PROGRAMS * BLOCK):
        raise ValueError(f"a pair's second tensor at {y_at} does not start on a whole round of programs")
    if y_at + n > slot_elems:
        raise ValueError(f"{n} elements exceed the one-shot all-reduce's buffer slot ({slot_elems})")
    run_kernel(_one_shot_all_reduce_kernel, (programs_for(n),), x, x if y is None else y, buffers, signals, epochs,
               n, slot_elems, y_at, RANK=rank, WORLD=world, BLOCK=BLOCK, PAIR=y is not None,
               PUSH=world == 2 and PUSH_TWO_RANKS, num_warps=8)
    return x if y is None else (x, y)


def _refuses(platform, shape: dict) -> str | None:
    if platform.kind == "rocm":
        return ("not verified on ROCm, where IPC memory is coarse-grained (AITER's custom all-reduce is the way "
                "there)")
    return None


# tensor parallelism's decode all-reduce over peer memory, and the group's peer memory it runs on (which the
# residual update reading RankPartials uses too)
declare("one_shot_all_reduce", "triton", one_shot_all_reduce, refuses=_refuses)
declare("custom_all_reduce", "triton", PeerMemory.for_group, refuses=_refuses, module=__name__)
