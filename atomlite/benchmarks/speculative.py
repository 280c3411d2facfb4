"""`atomlite bench speculative`: what speculative decoding gains and costs at batch 1, every row measured in one run
against decoding without drafts:
- oracle drafts (the target's own greedy continuation, recorded first): every draft accepted, the gain's bound;
- rejected drafts (a token other than the target's each time): nothing accepted, the overhead's bound;
- the verify step of k + 1 tokens against a one-token decode step (which hides its host work behind the GPU by
  running ahead, as a verify step cannot), and against one that does not run ahead;
- the drafter of --speculative-config (mtp, ngram) on the same prompts: its tokens per second and acceptance.
Random token prompts, greedy, no EOS."""
import statistics
import time

from atomlite.benchmarks.offline import _submit, random_prompts
from atomlite.engine.llm_engine import LLMEngine
from atomlite.engine.spec.drafters import ReplayDrafter


def _decode(engine: LLMEngine, prompt: list[int], output_len: int) -> tuple[list[float], list[int]]:
    """(seconds of each step after the one that gave the first token, the output tokens)."""
    seq = _submit(engine, [prompt], output_len)[0]
    steps = []
    while engine.has_unfinished():
        decoding = seq.num_output_tokens >= 1
        start = time.perf_counter()
        engine.step()  # ends with the step's tokens on the host: its GPU work is done
        if decoding:
            steps.append(time.perf_counter() - start)
    return steps, seq.output_token_ids


class Runs:
    """Decoding the same prompts with one drafter after another; per drafter: seconds per output token after the
    first, step times, outputs and acceptance."""

    def __init__(self, engine: LLMEngine, prompts: list[list[int]], output_len: int):
        self.engine, self.prompts, self.output_len = engine, prompts, output_len

    def run(self, drafter, k: int) -> dict:
        engine = self.engine
        engine.set_drafter(drafter, k)
        _decode(engine, self.prompts[0], 8)  # warm: every kernel variant of this drafter's steps
        engine.set_drafter(drafter, k)
        seconds, tokens, steps, outputs = 0.0, 0, [], []
        for prompt in self.prompts:
            times, output = _decode(engine, prompt, self.output_len)
            seconds, tokens = seconds + sum(times), tokens + len(output) - 1
            steps += times
            outputs.append(output)
        stats = engine.spec_stats
        return {"s_per_token": seconds / tokens, "step_s": statistics.median(steps), "outputs": outputs,
                "acceptance_length": stats.mean_acceptance_length, "drafts": stats.num_drafts}


def _row(name: str, result: dict, base: dict, note: str) -> dict:
    return {"metric": name, "ms_per_token": result["s_per_token"] * 1e3, "tok_per_s": 1 / result["s_per_token"],
            "ratio": result["s_per_token"] / base["s_per_token"],
            "acceptance_length": result["acceptance_length"] if result["drafts"] else None, "note": note}


def run_speculative(engine: LLMEngine, input_len: int, output_len: int, repeats: int, seed: int) -> list[dict]:
    own, k = engine.drafter, engine.num_speculative_tokens
    prompts = random_prompts(engine, repeats, input_len, seed)
    runs = Runs(engine, prompts, output_len)
    base = runs.run(None, 0)
    overlap, engine.config.overlap_decode = engine.config.overlap_decode, False
    exposed = runs.run(None, 0)  # each step's host work after its GPU work, as a verify step's is
    engine.config.overlap_decode = overlap
    scripts = {tuple(p): out for p, out in zip(prompts, base["outputs"])}
    oracle = runs.run(ReplayDrafter(scripts, engine.vocab_size), k)
    rejected = runs.run(ReplayDrafter(scripts, engine.vocab_size, corrupt=True), k)
    mine = runs.run(own, k)
    engine.set_drafter(own, k)
    rows = [_row("no drafts", base, base, "TPOT at batch 1, the baseline of every ratio"),
            _row(f"oracle drafts, k={k}", oracle, base, "the target's own greedy continuation: all accepted"),
            _row(f"rejected drafts, k={k}", rejected, base, "a wrong token each time: none accepted"),
            {"metric": f"verify step of {k + 1} tokens", "ms_per_token": rejected["step_s"] * 1e3,
             "tok_per_s": None, "ratio": rejected["step_s"] / base["step_s"], "acceptance_length": None,
             "note": f"median step, against a 1-token decode step of {base['step_s'] * 1e3:.2f} ms"},
            {"metric": "  the same, host not hidden", "ms_per_token": rejected["step_s"] * 1e3,
             "tok_per_s": None, "ratio": rejected["step_s"] / exposed["step_s"], "acceptance_length": None,
             "note": f"against a decode step that does not run ahead either: {exposed['step_s'] * 1e3:.2f} ms"},
            _row(f"{engine.config.speculative_config.method} drafts, k={k}", mine, base,
                 "--speculative-config's drafter on the same prompts")]
    for row, result in ((rows[1], oracle), (rows[-1], mine)):
        row["identical_to_no_drafts"] = result["outputs"] == base["outputs"]
    return rows


def format_speculative(rows: list[dict]) -> list[str]:
    lines = [f"{'metric':<30} {'ms/token':>9} {'tok/s':>8} {'ms vs none':>10} {'accept len':>10}  note"]
    for r in rows:
        tok_s = f"{r['tok_per_s']:8.1f}" if r["tok_per_s"] else f"{'':>8}"
        accept = f"{r['acceptance_length']:10.2f}" if r["acceptance_length"] else f"{'':>10}"
        same = "" if "identical_to_no_drafts" not in r else \
            ("; output identical to no drafts" if r["identical_to_no_drafts"] else "; OUTPUT DIFFERS from no drafts")
        lines.append(f"{r['metric']:<30} {r['ms_per_token']:9.2f} {tok_s} {r['ratio']:9.2f}x {accept}  "
                     f"{r['note']}{same}")
    return lines
