"""Kernels compiled before the first request, not during it: a GPU engine runs eager forward passes at the token
counts its steps can have, so Triton compiles every kernel variant those shapes pick. Kernels specialize on their
configs by row count and on integer arguments (1, multiples of 16), so the counts are each power of two, one
either side of it, the small counts, and the step budget. Each pass is a mixed step: decode rows (one new token
after some context) beside a prompt chunk, as a loaded server runs. The sequences are temporary; their blocks go
back to the pool."""
import time

import torch
from tqdm import tqdm

from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.runner.model_runner import ModelRunner
from atomlite.engine.sequence import Sequence
from atomlite.sampling_params import SamplingParams

DECODE_ROWS, DECODE_CONTEXT = 4, 17


def warmup_token_counts(max_tokens: int) -> list[int]:
    counts = set(range(1, 9)) | {max_tokens - 1, max_tokens}
    power = 16
    while power // 2 <= max_tokens:
        counts |= {power - 1, power, power + 1}
        power *= 2
    return sorted(n for n in counts if 1 <= n <= max_tokens)


def _mixed_batch(kv: KVCacheManager, tokens: int, max_seq_len: int) -> list[tuple[Sequence, int]] | None:
    """Decode rows and prompt chunks (of at most max_seq_len tokens each) adding up to `tokens`; None when the
    cache cannot hold them."""
    decode_rows = min(tokens - 1, DECODE_ROWS)
    sizes = [DECODE_CONTEXT] * decode_rows
    left = tokens - decode_rows
    while left:
        sizes.append(min(left, max_seq_len))
        left -= sizes[-1]
    batch = []
    for size in sizes:
        seq = Sequence([0] * size, SamplingParams(max_tokens=1))
        batch.append(seq)
        if not kv.allocate(seq, size):
            for allocated in batch:
                kv.free(allocated)
            return None
    for seq in batch[:decode_rows]:
        seq.num_computed_tokens = DECODE_CONTEXT - 1
    return [(seq, 1) for seq in batch[:decode_rows]] + [(seq, size) for seq, size in
                                                          zip(batch[decode_rows:], sizes[decode_rows:])]


def warm_up(runner: ModelRunner, kv: KVCacheManager, max_tokens: int, max_seq_len: int,
            device: torch.device) -> str:
    """Runs the passes (steps of up to max_tokens tokens, sequences of up to max_seq_len); returns the startup line
    that says what they took."""
    start = time.perf_counter()
    counts = warmup_token_counts(max_tokens)
    # eager, so that the steps prefill graphs leave to it (soft tokens) find their kernels compiled
    with runner.eager_prefills():
        for tokens in tqdm(counts, desc="Warm-up steps", unit="step", delay=1.0):
            batch = _mixed_batch(kv, tokens, max_seq_len)
            if batch is None:
                continue  # a cache too small for this step's blocks: such a step never runs either
            try:
                runner.execute(batch)
            finally:
                for seq, _ in batch:
                    kv.free(seq)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (f"warm-up: {len(counts)} mixed steps of {counts[0]}..{counts[-1]} tokens in "
            f"{time.perf_counter() - start:.1f} s (kernels compiled before the first request)")
