"""`atomlite bench latency` and `atomlite bench throughput`: the engine in this process, random token prompts,
every result beside its roofline (probed in the same run)."""
import statistics
import time

import torch
from tqdm import tqdm

from atomlite.benchmarks.roofline import (Probes, RoutedExperts, decode_step_bytes, packed_prefill_seconds,
                                          prefill_roofline)
from atomlite.engine.llm_engine import LLMEngine
from atomlite.multimodal.inputs import MultiModalPrompt
from atomlite.sampling_params import SamplingParams

_request_ids = iter(range(1 << 62))


def random_prompts(engine: LLMEngine, count: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, engine.vocab_size, (count, length), generator=g).tolist()


def _sync(engine: LLMEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def _add(engine: LLMEngine, prompt: list[int] | MultiModalPrompt, params: SamplingParams):
    request_id = f"bench-{next(_request_ids)}"
    if isinstance(prompt, MultiModalPrompt):
        return engine.add_request(request_id, prompt.prompt_token_ids, params, multimodal=prompt)
    return engine.add_request(request_id, prompt, params)


def _submit(engine: LLMEngine, prompts: list[list[int] | MultiModalPrompt], max_tokens: int) -> list:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [_add(engine, p, params) for p in prompts]


def time_to_first_token(engine: LLMEngine, prompt: list[int] | MultiModalPrompt) -> float:
    _sync(engine)
    start = time.perf_counter()
    _submit(engine, [prompt], 1)
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def decode_step_times(engine: LLMEngine, prompts: list[list[int]], output_len: int, bar: tqdm | None) -> list[float]:
    """Seconds of each step once every sequence has its first token (so: decode-only steps)."""
    seqs = _submit(engine, prompts, output_len)
    times = []
    while engine.has_unfinished():
        decoding = all(len(s.output_token_ids) >= 1 for s in seqs)
        start = time.perf_counter()
        engine.step()  # ends with the sampled ids copied to the host: the step's GPU work is done
        if decoding:
            times.append(time.perf_counter() - start)
            if bar is not None:
                bar.update()
    return times


ABSURD_RATIO = 20.0  # over this many times its roofline, a result says more about the machine than the engine


def row(name: str, seconds: float, roofline: float, what: str) -> dict:
    return {"metric": name, "ms": seconds * 1e3, "roofline_ms": roofline * 1e3, "ratio": seconds / roofline,
            "roofline": what}


def warm_up(engine: LLMEngine, batch_size: int, input_len: int, seed: int) -> None:
    """Compiles every kernel variant the timed text runs use."""
    decode_step_times(engine, random_prompts(engine, batch_size, input_len, seed + 1), 4, None)


def ttft_row(engine: LLMEngine, probes: Probes, input_len: int, repeats: int, seed: int) -> dict:
    """The median TTFT against the larger of the prompt's FLOPs and its bytes: the weights its prefill reads, the
    routed experts counted from each timed prompt's own routing (their mean), and its KV. A prefill replayed from a
    graph calls no hook: each prompt's routing is counted from it run again, eager and without its cached prefix."""
    routed, ttfts, reads = RoutedExperts(engine.model), [], []
    for prompt in tqdm(random_prompts(engine, repeats, input_len, seed + 2), desc="TTFT", leave=False):
        ttfts.append(time_to_first_token(engine, prompt))
        if routed.layers:
            with routed.counting(), engine.runner.eager_prefills(), engine.kv.prefix_caching_off():
                time_to_first_token(engine, prompt)
        reads.append(routed.reads())
        routed.clear()
    mean_reads = {m: statistics.fmean(r[m] for r in reads) for m in routed.layers}
    seconds, what, figures = prefill_roofline(engine.model, engine.kv_specs, probes, input_len,
                                              engine.config.max_num_batched_tokens, mean_reads)
    result = row(f"TTFT, {input_len}-token prompt", statistics.median(ttfts), seconds, what)
    result |= figures | {"experts_read_per_layer": [mean_reads[m] for m in routed.layers]}
    return result


def tpot_rows(engine: LLMEngine, probes: Probes, input_len: int, output_len: int, batch_size: int,
              seed: int) -> list[dict]:
    rows, context = [], input_len + output_len // 2
    for batch in sorted({1, batch_size}):
        with tqdm(total=output_len - 1, desc=f"TPOT batch {batch}", leave=False) as bar:
            steps = decode_step_times(engine, random_prompts(engine, batch, input_len, seed + 3 + batch),
                                      output_len, bar)
        step_bytes = decode_step_bytes(engine.model, engine.kv_specs, batch, context)
        rows.append(row(f"TPOT, batch {batch}", statistics.median(steps),
                        step_bytes["total"] / probes.copy_bytes_per_s,
                        f"{step_bytes['weights'] / 1e9:.2f} GB weights + {step_bytes['kv'] / 1e9:.3f} GB KV "
                        f"(context {context}) at the probed copy bandwidth"))
    return rows


def run_latency(engine: LLMEngine, probes: Probes, input_len: int, output_len: int, batch_size: int,
                repeats: int, seed: int) -> list[dict]:
    warm_up(engine, batch_size, input_len, seed)
    return [ttft_row(engine, probes, input_len, repeats, seed),
            *tpot_rows(engine, probes, input_len, output_len, batch_size, seed)]


def run_throughput(engine: LLMEngine, probes: Probes, num_prompts: int, input_len: int, output_len: int,
                   seed: int) -> list[dict]:
    model, specs = engine.model, engine.kv_specs
    decode_step_times(engine, random_prompts(engine, min(num_prompts, 4), input_len, seed + 1), 4, None)
    prompts = random_prompts(engine, num_prompts, input_len, seed)
    preemptions_before = engine.scheduler.num_preemptions
    _sync(engine)
    start = time.perf_counter()
    seqs = _submit(engine, prompts, output_len)
    prefill_seconds = 0.0
    with tqdm(total=num_prompts, desc="requests", leave=False) as bar:
        while engine.has_unfinished():
            step_start = time.perf_counter()
            bar.update(sum(u.finished for u in engine.step()))
            if engine.step_prefilled:
                prefill_seconds += time.perf_counter() - step_start
    seconds = time.perf_counter() - start
    tokens = sum(len(s.output_token_ids) for s in seqs)
    batch = throughput_batch(engine, num_prompts, input_len + output_len)
    waves = -(-num_prompts // batch)
    step_bytes = decode_step_bytes(model, specs, batch, input_len + output_len // 2)["total"]
    budget = engine.config.max_num_batched_tokens
    roofline = (packed_prefill_seconds(model, specs, probes, num_prompts, input_len, budget)
                + waves * (output_len - 1) * step_bytes / probes.copy_bytes_per_s)
    result = row(f"{num_prompts} requests, {input_len} in / {output_len} out", seconds, roofline,
                 f"prefill steps of {budget} tokens, each the larger of its FLOPs and its bytes + {waves} wave(s) of "
                 f"{output_len - 1} decode steps at batch {batch} (the sequences the KV cache and --max-num-seqs hold)")
    result["output_tok_per_s"] = tokens / seconds
    result["roofline_tok_per_s"] = tokens / roofline
    result["preemptions"] = engine.scheduler.num_preemptions - preemptions_before
    result["prefill_step_share"] = prefill_seconds / seconds
    return [result]


def throughput_batch(engine: LLMEngine, num_prompts: int, seq_len: int) -> int:
    """The decode batch a throughput run can hold at once: its prompts, --max-num-seqs, or the sequences of seq_len
    tokens the KV cache fits, whichever is fewest."""
    return max(1, min(num_prompts, engine.config.max_num_seqs, engine.kv_plan.seqs_that_fit(seq_len)))


def format_table(rows: list[dict]) -> list[str]:
    lines = [f"{'metric':<40} {'ms':>10} {'roofline ms':>12} {'ratio':>7}  roofline"]
    for r in rows:
        lines.append(f"{r['metric']:<40} {r['ms']:10.2f} {r['roofline_ms']:12.2f} {r['ratio']:6.2f}x  {r['roofline']}")
        if "output_tok_per_s" in r:
            lines.append(f"{'':<40} output {r['output_tok_per_s']:.1f} tok/s "
                         f"(roofline {r['roofline_tok_per_s']:.1f} tok/s), {r['preemptions']} preemptions, "
                         f"{100 * r['prefill_step_share']:.0f}% of the time in steps with prompt tokens")
        if "images_per_s" in r:
            lines.append(f"{'':<40} {r['images_per_s']:.1f} images/s (roofline {r['roofline_images_per_s']:.1f} "
                         f"images/s)")
        if "note" in r:
            lines.append(f"{'':<40} {r['note']}")
    worst = max((r["ratio"] for r in rows), default=0.0)
    if worst > ABSURD_RATIO:
        lines.append(f"warning: {worst:.0f}x the roofline is more than a slow kernel explains; check that no other "
                     f"process is busy on these cores and the engine's CPU threads (the startup line; --cpu-threads, "
                     f"OMP_NUM_THREADS), and on a GPU the kernels chosen (-v: a torch reference kernel, eager decode)")
    return lines
