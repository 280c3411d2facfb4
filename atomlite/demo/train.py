"""Train the bundled demo model: a tiny Gemma 4 (sliding + global layers with different head dims, k_eq_v on
the global ones, a window shorter than a few-shot prompt) on synthetic arithmetic in gsm8k and MMLU formats.

    python -m atomlite.demo.train [--out atomlite/demo/model] [--steps 2400]

Seeded and reproducible (same machine, same thread count); about 30 minutes on 2 idle CPU cores (a C++
compiler is needed: the step is compiled with torch.compile). It trains with
transformers' own Gemma4ForCausalLM, then saves config.json, model.safetensors and the tokenizer.
"""
import argparse
import math
import random
import time
from pathlib import Path

import torch

from atomlite.demo.data import (MMLU_DESCRIPTION, TRAIN_SEED, gsm8k_doc, gsm8k_text, mmlu_doc, mmlu_text,
                                training_episode)
from atomlite.demo.tokenizer import build_char_tokenizer

from atomlite.demo import DEMO_DIR
CONFIG = dict(vocab_size=128, hidden_size=128, intermediate_size=512, num_hidden_layers=6, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1,
              attention_k_eq_v=True, sliding_window=128, final_logit_softcapping=30.0,
              hidden_size_per_layer_input=0, max_position_embeddings=2048, pad_token_id=0, eos_token_id=1,
              bos_token_id=2, layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2)


def token_stream(tokenizer, rng: random.Random):
    """(token, weight of predicting it) for an endless run of training episodes."""
    while True:
        for text, weight in training_episode(rng):
            for token in tokenizer.encode(text, add_special_tokens=False):
                yield token, weight


def batches(tokenizer, rng: random.Random, batch_size: int, seq_len: int):
    stream = token_stream(tokenizer, rng)
    while True:
        rows = [[next(stream) for _ in range(seq_len)] for _ in range(batch_size)]
        yield (torch.tensor([[t for t, _ in row] for row in rows]),
               torch.tensor([[w for _, w in row] for row in rows]))


def weighted_loss(model, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits[:, :-1].float()
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                               reduction="none")
    w = weights[:, 1:].reshape(-1)
    return (losses * w).sum() / w.sum()


PROBE_SEED, PROBE_DOCS, PROBE_SHOTS = 2001, 64, 3


def probe_set(tokenizer) -> dict[str, list[tuple[list[int], int]]]:
    """Held-out few-shot prompts per task as (token ids, number of answer tokens at the end), from a seed
    disjoint from training and from the evaluation files."""
    rng, tasks = random.Random(PROBE_SEED), {}
    for task, make, render, description in [("gsm8k", gsm8k_doc, gsm8k_text, ""),
                                            ("mmlu", mmlu_doc, mmlu_text, MMLU_DESCRIPTION)]:
        shots = "".join(render(make(rng)) + "\n\n" for _ in range(PROBE_SHOTS))
        items = []
        for _ in range(PROBE_DOCS):
            doc = make(rng)
            prompt = tokenizer.encode(description + shots + render(doc, with_answer=False), add_special_tokens=False)
            answer = tokenizer.encode(render(doc)[len(render(doc, with_answer=False)):], add_special_tokens=False)
            items.append((prompt + answer, len(answer)))
        tasks[task] = items
    return tasks


@torch.no_grad()
def probe(model, probes, device) -> dict[str, float]:
    """Share of held-out answers whose every token is the model's top choice given the true prefix (teacher
    forcing): close to greedy exact match for gsm8k, and to letter accuracy for MMLU."""
    scores = {}
    for task, items in probes.items():
        correct = 0
        for ids, n_answer in items:
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0]
            predicted = logits[-n_answer - 1:-1].argmax(-1).tolist()
            correct += predicted == ids[-n_answer:]
        scores[task] = correct / len(items)
    return scores


def learning_rate(step: int, steps: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))) + peak * 0.02


def train(out: Path, steps: int, batch_size: int, seq_len: int, lr: float, seed: int, device: str = "cpu",
          probe_every: int = 0) -> None:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    torch.manual_seed(seed)
    rng = random.Random(TRAIN_SEED + seed)
    tokenizer = build_char_tokenizer()
    model = Gemma4ForCausalLM(Gemma4TextConfig(**CONFIG)).float().to(device).train()
    probes = probe_set(tokenizer) if probe_every else None
    params = sum(p.numel() for p in model.parameters())
    print(f"demo model: {params / 1e6:.2f}M parameters; {steps} steps of {batch_size} x {seq_len} tokens", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98))
    # inductor fuses the many small elementwise ops of a model this size: ~8x faster steps on CPU
    forward = torch.compile(lambda ids, weights: weighted_loss(model, ids, weights))
    start, data = time.monotonic(), batches(tokenizer, rng, batch_size, seq_len)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, steps, lr)
        ids, weights = next(data)
        loss = forward(ids.to(device), weights.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.monotonic() - start:6.0f}s", flush=True)
        if probes and (step % probe_every == probe_every - 1 or step == steps - 1):
            model.eval()
            scores = probe(model, probes, device)
            model.train()
            print(f"step {step:5d}  probe " + "  ".join(f"{k} {v:.3f}" for k, v in scores.items()), flush=True)
    model.eval().cpu().save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"saved to {out}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEMO_DIR)
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="the committed weights come from cpu; cuda is for trying ideas")
    parser.add_argument("--probe-every", type=int, default=200,
                        help="every N steps print held-out gsm8k/MMLU answer accuracy (0: never)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train(args.out, args.steps, args.batch_size, args.seq_len, args.lr, args.seed, args.device, args.probe_every)


if __name__ == "__main__":
    main()
