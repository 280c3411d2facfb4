"""Decode TPOT with every request of a batch under a JSON schema, against the same batch unconstrained, one engine,
same run: what a structured_outputs grammar costs per step (the host fills the masks while the forward runs; the
step after waits for the host's token instead of running ahead).

Dummy weights come without a tokenizer, so the engine gets a synthetic one of the model's vocabulary size
(lowercase pieces of one to four letters, then the specials), which gives xgrammar a vocabulary of the real size.
The schema's string has a minLength no run reaches, so every row decodes all --output-len tokens.

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
from atomlite.engine.structured import StructuredOutputs  # noqa: E402

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "minLength": 100000}}, "required": ["answer"]}
SPECIALS = ["<pad>", "<eos>", "<bos>"]


def synthetic_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    pieces = (("".join(p) for p in itertools.product(string.ascii_lowercase, repeat=n)) for n in range(1, 5))
    words = list(itertools.islice(itertools.chain(["{", "}", '"', ":", " ", ","], *pieces), vocab_size - 3))
    vocab = {w: i for i, w in enumerate(SPECIALS + words)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")


def decode_step_ms(engine, prompts, params) -> float:
    seqs = [engine.add_request(f"r{next(IDS)}", p, params) for p in prompts]
    times = []
    while engine.has_unfinished():
        decoding = all(len(s.output_token_ids) >= 1 for s in seqs)
        start = time.perf_counter()
        engine.step()
        if decoding:
            times.append(time.perf_counter() - start)
    assert all(len(s.output_token_ids) == params.max_tokens for s in seqs), "a row stopped early"
    return statistics.median(times) * 1e3


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
    results = {"unconstrained": [], "json_schema": []}
    for _ in range(args.repeats):
        results["unconstrained"].append(decode_step_ms(engine, prompts, free))
        results["json_schema"].append(decode_step_ms(engine, prompts, json_schema))
    base = statistics.median(results["unconstrained"])
    print(f"{args.model}, batch {args.batch_size}, {args.input_len} in / {args.output_len} out, decode step median "
          f"of {args.repeats} runs")
    for name, runs in results.items():
        ms = statistics.median(runs)
        print(f"  {name:14s} {ms:7.2f} ms  {ms / base:.2f}x   runs: {', '.join(f'{r:.2f}' for r in runs)}")


if __name__ == "__main__":
    main()
