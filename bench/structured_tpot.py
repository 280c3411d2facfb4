"""Decode TPOT with every request of a batch under a JSON schema, against the same batch unconstrained, one engine,
same run: what a structured_outputs grammar costs per step (the next forward runs ahead while the host takes the
tokens and fills the masks; the sampling waits for them).

Dummy weights come without a tokenizer, so the engine gets a synthetic one of the model's vocabulary size
(printable ASCII characters, then lowercase pieces of one to four letters), which gives xgrammar a vocabulary of
the real size. Only the steps where both runs decode every row of the batch are compared (a grammar may end a
row early).

    PYTHONPATH=. python bench/structured_tpot.py --model examples/configs/gemma-4-26B-A4B-it [--batch-size 16]
"""
import argparse
import itertools
import statistics
import string
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenizers import Tokenizer, models  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from atomlite import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402
from atomlite.benchmarks.offline import random_prompts  # noqa: E402
from atomlite.engine.sampling.structured import StructuredOutputs  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                          "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"]}
SPECIALS = ["<pad>", "<eos>", "<bos>"]


def synthetic_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    pieces = (("".join(p) for p in itertools.product(string.ascii_lowercase, repeat=n)) for n in range(1, 5))
    printable = [c for c in string.printable if c not in string.ascii_lowercase and c not in "\t\r\x0b\x0c"]
    words = list(itertools.islice(itertools.chain(printable, *pieces), vocab_size - 3))
    vocab = {w: i for i, w in enumerate(SPECIALS + words)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")


def decode_step_ms(engine, prompts, params) -> list[float]:
    """Each step's milliseconds while every row of the batch decodes (from the first decode step on)."""
    seqs = [engine.add_request(f"r{next(IDS)}", p, params) for p in prompts]
    times = []
    while engine.has_unfinished():
        decoding = all(1 <= len(s.output_token_ids) < params.max_tokens - 1 and not s.is_finished for s in seqs)
        start = time.perf_counter()
        engine.step()
        if decoding:
            times.append(time.perf_counter() - start)
    lengths = sorted(len(s.output_token_ids) for s in seqs)
    if lengths[0] < params.max_tokens:
        print(f"  (a row's grammar ended early: output lengths {lengths}; {len(times)} steps timed)")
    return [t * 1e3 for t in times]


IDS = itertools.count()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_num_seqs=args.batch_size, max_model_len=1024)
    engine = llm.engine
    engine.tokenizer = synthetic_tokenizer(engine.vocab_size)
    engine.structured = StructuredOutputs(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)
    prompts = random_prompts(engine, args.batch_size, args.input_len, seed=0)
    free = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    json_schema = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMA))
    decode_step_ms(engine, prompts, json_schema)  # compiles the grammar and warms both paths
    decode_step_ms(engine, prompts, free)
    results = {"unconstrained": [], "json_schema": []}
    for _ in range(args.repeats):
        free_ms, constrained_ms = decode_step_ms(engine, prompts, free), decode_step_ms(engine, prompts, json_schema)
        steps = min(len(free_ms), len(constrained_ms))  # the same steps of both (a grammar may end a row early)
        results["unconstrained"].append(statistics.median(free_ms[:steps]))
        results["json_schema"].append(statistics.median(constrained_ms[:steps]))
    base = statistics.median(results["unconstrained"])
    print(f"{args.model}, batch {args.batch_size}, {args.input_len} in / {args.output_len} out, median decode step "
          f"(the steps where both runs decode every row) of {args.repeats} runs")
    for name, runs in results.items():
        ms = statistics.median(runs)
        print(f"  {name:14s} {ms:7.2f} ms  {ms / base:.2f}x   runs: {', '.join(f'{r:.2f}' for r in runs)}")


if __name__ == "__main__":
    main()
