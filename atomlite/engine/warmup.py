"""Kernels compiled before the first request, not during it: a GPU engine runs eager forward passes at the token
counts its steps can have, so Triton compiles every kernel variant those shapes pick. Kernels specialize on their
configs by row count and on integer arguments (1, multiples of 16), so the counts are each power of two, one
either side of it, the small counts, and the step budget. Each pass is a mixed step: decode rows (one new token
after some context) beside a prompt chunk, as a loaded server runs. The sequences are temporary; their blocks go
back to the pool."""
import time

import torch

from atomlite.engine.kv_cache import KVCacheManager
from atomlite.engine.model_runner import ModelRunner
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


def _mixed_batch(kv: KVCacheManager, tokens: int) -> list[tuple[Sequence, int]] | None:
    decode_rows = min(tokens - 1, DECODE_ROWS)
    batch = []
    for _ in range(decode_rows):
        seq = Sequence([0] * DECODE_CONTEXT, SamplingParams(max_tokens=1))
        batch.append((seq, kv.allocate(seq, DECODE_CONTEXT)))
        seq.num_computed_tokens = DECODE_CONTEXT - 1
    prompt = Sequence([0] * (tokens - decode_rows), SamplingParams(max_tokens=1))
    batch.append((prompt, kv.allocate(prompt, tokens - decode_rows)))
    if not all(allocated for _, allocated in batch):
        for seq, _ in batch:
            kv.free(seq)
        return None
    return [(seq, 1) for seq, _ in batch[:-1]] + [(prompt, tokens - decode_rows)]


def warm_up(runner: ModelRunner, kv: KVCacheManager, max_tokens: int, device: torch.device) -> str:
    """Runs the passes; returns the startup line that says what they took."""
    start = time.perf_counter()
    counts = warmup_token_counts(max_tokens)
    for tokens in counts:
        batch = _mixed_batch(kv, tokens)
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
