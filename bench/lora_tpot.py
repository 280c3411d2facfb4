"""Decode TPOT with LoRA adapters in the batch against the base model's, same machine, same run (issue 57's bound:
<= 1.15x): a batch of --batch-size requests spread round-robin over --adapters dummy rank-`--rank` adapters, then the
same batch on the base model with LoRA off. Each side runs in a process of its own (two 31B engines do not fit one
GPU), dummy weights, adapters written once (random A and B in PEFT's format, at the model's shapes) to --workdir.

    PYTHONPATH=. python bench/lora_tpot.py --model examples/configs/gemma-4-31B-it
    PYTHONPATH=. python bench/lora_tpot.py --model examples/configs/gemma-4-26B-A4B-it --targets attention

Before timing, one LoRA row is checked against the torch reference of the shrink/expand ops on its own layer (the
kernels' results, not only their speed).
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from atomlite import LLM, SamplingParams  # noqa: E402
from atomlite.benchmarks.offline import random_prompts  # noqa: E402
from atomlite.lora import LoRARequest  # noqa: E402

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_adapters(targets: dict, count: int, rank: int, which: str, workdir: Path) -> list[Path]:
    """count PEFT adapter folders over the targets (checkpoint module name -> lora.targets.Target)."""
    folders = []
    for i in range(count):
        folder = workdir / f"adapter{i}"
        folders.append(folder)
        if (folder / "adapter_model.safetensors").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        g = torch.Generator().manual_seed(i)
        tensors = {}
        for name, target in targets.items():
            if which == "attention" and not name.endswith(ATTENTION):
                continue
            tensors[f"base_model.model.{name}.lora_A.weight"] = (torch.randn(rank, target.in_features, generator=g)
                                                                 * 0.01).bfloat16()
            tensors[f"base_model.model.{name}.lora_B.weight"] = (torch.randn(target.out_features, rank, generator=g)
                                                                 * 0.01).bfloat16()
        save_file(tensors, folder / "adapter_model.safetensors")
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                                "bias": "none"}))
    return folders


def decode_ms(engine, prompts, params, loras) -> float:
    """Median milliseconds of the steps where every row decodes."""
    seqs = [engine.add_request(f"r{time.monotonic_ns()}-{i}", p, params, lora_request=lora)
            for i, (p, lora) in enumerate(zip(prompts, loras))]
    times = []
    while engine.has_unfinished():
        decoding = all(1 <= len(s.output_token_ids) < params.max_tokens - 1 for s in seqs)
        start = time.perf_counter()
        engine.step()
        if decoding:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def check_one_layer(engine) -> None:
    """A loaded slot's shrink/expand on one projection against the torch reference ops."""
    from atomlite.model_ops.torch_ref import lora as ref
    layers = [m.lora for m in engine.model.modules() if getattr(m, "lora", None) is not None]
    lora = layers[0]
    x = torch.randn(4, lora.a.shape[2], device=lora.a.device, dtype=lora.a.dtype)
    slots = torch.tensor([0, -1, 0, 0], dtype=torch.int32, device=x.device)
    got = torch.zeros(4, lora.b.shape[1], device=x.device, dtype=x.dtype)
    want = got.clone()
    lora._expand(got, lora._shrink(x, lora.a, slots), lora.b, slots, lora.slice_sizes)
    ref.lora_expand(want, ref.lora_shrink(x, lora.a, slots), lora.b, slots, lora.slice_sizes)
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=1e-3)
    assert want.abs().sum() > 0, "the adapter slot is empty"


def run_side(args) -> dict:
    lora_on = args.side == "lora"
    extra = dict(enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank) if lora_on else {}
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_num_seqs=args.batch_size,
              max_model_len=args.max_model_len,
              **extra)
    engine = llm.engine
    prompts = random_prompts(engine, args.batch_size, args.input_len, seed=0)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    loras = [None] * args.batch_size
    if lora_on:
        workdir = Path(args.workdir) / f"{Path(args.model).name}-{args.targets}-r{args.rank}"  # shapes differ
        folders = write_adapters(engine.loras.slots.targets, args.adapters, args.rank, args.targets, workdir)
        requests = [LoRARequest(f"a{i}", i + 1, str(f)) for i, f in enumerate(folders)]
        loras = [requests[i % len(requests)] for i in range(args.batch_size)]
    decode_ms(engine, prompts, params, loras)  # warm-up (and the adapters' first loads)
    if lora_on:
        check_one_layer(engine)
    runs = [decode_ms(engine, prompts, params, loras) for _ in range(args.repeats)]
    return {"side": args.side, "ms": statistics.median(runs), "runs": runs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", choices=["all", "attention"], default="all")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--workdir", default="/tmp/atomlite-lora-bench")
    ap.add_argument("--side", choices=["lora", "base"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side is not None:
        print(json.dumps(run_side(args)))
        return
    results = {}
    for side in ("base", "lora"):
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--side", side], capture_output=True,
                              text=True)
        if done.returncode:
            sys.exit(f"the {side} run failed:\n{done.stderr[-4000:]}")
        results[side] = json.loads(done.stdout.strip().splitlines()[-1])
    base = results["base"]["ms"]
    print(f"{args.model}, batch {args.batch_size}, {args.input_len} in / {args.output_len} out, {args.adapters} "
          f"rank-{args.rank} adapters ({args.targets} projections), median decode step of {args.repeats} runs")
    for side, result in results.items():
        runs = ", ".join(f"{r:.2f}" for r in result["runs"])
        print(f"  {side:5s} {result['ms']:7.2f} ms  {result['ms'] / base:.3f}x   runs: {runs}")


if __name__ == "__main__":
    main()
