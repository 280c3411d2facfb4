"""End-to-end generation: atomlite's engine against transformers' generate() on the same random Gemma 4
checkpoint (Gemma-4-like heads: 256-dim sliding, 512-dim global, k_eq_v), same GPU, same run.

    PYTHONPATH=. python bench/engine.py [--layers 12 --hidden 2048 --batch 32 --prompt 1024 --out 128]

Prints seconds and tokens/s for a prefill-only pass (max_tokens=1) and for full generation, as ratios to
transformers, plus how often the two agree on greedy tokens (bf16: near-ties may flip late tokens). Each engine
first runs the whole measured generation once, untimed, so one-time compilation stays out of the numbers.
"""
import argparse
import tempfile
import time

import torch


def build_checkpoint(args, out: str) -> None:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    layer_types = ["sliding_attention"] * 5 + ["full_attention"]
    cfg = Gemma4TextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128, num_key_value_heads=args.hidden // 512,
        head_dim=256, global_head_dim=512, num_global_key_value_heads=max(1, args.hidden // 2048),
        attention_k_eq_v=True, sliding_window=1024, final_logit_softcapping=30.0, hidden_size_per_layer_input=0,
        layer_types=(layer_types * args.layers)[:args.layers - 1] + ["full_attention"],
        max_position_embeddings=8192, dtype="bfloat16")
    torch.manual_seed(0)
    Gemma4ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, result


def run_hf(path, prompts, new_tokens):
    from transformers import Gemma4ForCausalLM
    model = Gemma4ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    model.generation_config.eos_token_id = None
    ids = torch.tensor(prompts, device="cuda")
    gen = lambda n: model.generate(ids, max_new_tokens=n, do_sample=False)  # noqa: E731
    with torch.no_grad():
        gen(new_tokens)  # warm-up at the measured shapes
        prefill, _ = timed(lambda: gen(1))
        total, out = timed(lambda: gen(new_tokens))
    del model
    torch.cuda.empty_cache()
    return prefill, total, out[:, ids.shape[1]:].tolist()


def run_atomlite(path, prompts, new_tokens, backend):
    from atomlite import LLM, SamplingParams
    llm = LLM(path, dtype="bfloat16", device="cuda", max_model_len=4096, max_num_seqs=len(prompts),
              max_num_batched_tokens=8192, kernel_backend=backend, enable_prefix_caching=False)
    params = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)  # noqa: E731
    llm.generate(prompts, params(new_tokens))  # warm-up: Triton compiles each kernel variant once
    prefill, _ = timed(lambda: llm.generate(prompts, params(1)))
    total, outs = timed(lambda: llm.generate(prompts, params(new_tokens)))
    del llm
    torch.cuda.empty_cache()
    return prefill, total, [o.outputs[0].token_ids for o in outs]


def agreement(a, b) -> float:
    """Mean fraction of each sequence's leading tokens that agree before the first difference."""
    fractions = []
    for x, y in zip(a, b):
        same = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), len(x))
        fractions.append(same / len(x))
    return sum(fractions) / len(fractions)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--out", type=int, default=128)
    p.add_argument("--backends", default="auto,torch")
    args = p.parse_args()
    print(f"device: {torch.cuda.get_device_name()}; model: {args.layers} layers, hidden {args.hidden}, "
          f"batch {args.batch} x prompt {args.prompt} + {args.out} new tokens, bf16", flush=True)
    with tempfile.TemporaryDirectory() as path:
        build_checkpoint(args, path)
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, args.vocab, (args.batch, args.prompt), generator=g).tolist()
        hf_prefill, hf_total, hf_tokens = run_hf(path, prompts, args.out)
        rows = [("transformers", hf_prefill, hf_total, 1.0)]
        for backend in args.backends.split(","):
            prefill, total, tokens = run_atomlite(path, prompts, args.out, backend)
            rows.append((f"atomlite ({backend})", prefill, total, agreement(tokens, hf_tokens)))
    new = args.batch * args.out
    print(f"\n{'engine':<22} {'prefill s':>10} {'vs HF':>7} {'generate s':>11} {'tok/s':>9} {'vs HF':>7} "
          f"{'greedy agree':>13}")
    for name, prefill, total, agree in rows:
        print(f"{name:<22} {prefill:10.3f} {hf_prefill / prefill:6.2f}x {total:11.3f} {new / total:9.0f} "
              f"{hf_total / total:6.2f}x {agree:13.2f}")


if __name__ == "__main__":
    main()
