"""Train the bundled demo model: a tiny Gemma 4 (sliding + global layers with different head dims, k_eq_v on
the global ones, a window shorter than a few-shot prompt) on synthetic arithmetic in gsm8k and MMLU formats.

    python -m tools.demo_training.train --device cuda [--max-seconds 480] [--out atomlite/demo/model]

The committed weights are two runs. First the defaults: 12000 steps of 32 x 512 tokens on one GPU, bf16 autocast,
the step compiled with torch.compile (eager if compiling fails). Then, from those weights, 500 steps with chats in
the mix, so that a chat turn ends (the reply, then <end_of_turn>, which config.json lists as an end-of-sequence
token), on a CPU:

    python -m tools.demo_training.train --device cpu --init atomlite/demo/model --chat-share 0.3 --steps 500 \
        --batch-size 8 --lr 3e-4 --no-compile

Seeded: each step's batch depends only on the seed and the step number, so the data is the same on every machine
and for any number of data workers.
`--device cpu` works too (a C++ compiler is needed for torch.compile), at CPU speed: pass fewer `--steps` and a
smaller `--batch-size` to try it. It trains with transformers' own Gemma4ForCausalLM, then saves config.json,
model.safetensors and the tokenizer.
"""
import argparse
import math
import random
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from atomlite.demo import DEMO_DIR
from atomlite.demo.tokenizer import SPECIALS, build_char_tokenizer
from tools.demo_training.data import (MMLU_DESCRIPTION, TRAIN_SEED, chat_episode, gsm8k_doc, gsm8k_text, mmlu_doc,
                                      mmlu_text, training_episode)

CONFIG = dict(vocab_size=128, hidden_size=256, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1,
              attention_k_eq_v=True, sliding_window=128, final_logit_softcapping=30.0,
              hidden_size_per_layer_input=0, max_position_embeddings=2048, pad_token_id=0, eos_token_id=[1, 4],
              bos_token_id=2, layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2)
MAX_WEIGHT_BYTES = 16 * 10**6  # the committed model.safetensors stays this small


def char_ids(tokenizer) -> dict[str, int]:
    """The tokenizer is one token per character: a table lookup encodes ~20x faster than tokenizer.encode."""
    return {token: i for token, i in tokenizer.get_vocab().items() if len(token) == 1}


def encode(table: dict[str, int], text: str) -> list[int]:
    return [table[c] for c in text]


SPECIAL_IDS = {token: i for i, token in enumerate(SPECIALS)}  # the tokenizer's first ids


def encode_piece(table: dict[str, int], text: str) -> list[int]:
    """A training piece: one special token ('<end_of_turn>', ...) or plain characters."""
    return [SPECIAL_IDS[text]] if text in SPECIAL_IDS else encode(table, text)


def training_batch(table: dict[str, int], seed: int, step: int, batch_size: int, seq_len: int,
                   chat_share: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, loss weight of predicting each token): episodes packed end to end into batch_size rows."""
    rng = random.Random(f"{TRAIN_SEED}/{seed}/{step}")
    ids, weights = [], []
    while len(ids) < batch_size * seq_len:
        for text, weight in training_episode(rng, chat_share):
            tokens = encode_piece(table, text)
            ids += tokens
            weights += [weight] * len(tokens)
    n = batch_size * seq_len
    return (torch.tensor(ids[:n], dtype=torch.long).view(batch_size, seq_len),
            torch.tensor(weights[:n]).view(batch_size, seq_len))


class TrainingBatches(torch.utils.data.IterableDataset):
    """The batches of steps 0..steps-1; worker w of W makes steps w, w+W, ... (the DataLoader interleaves them
    in step order)."""

    def __init__(self, table: dict[str, int], seed: int, steps: int, batch_size: int, seq_len: int,
                 chat_share: float = 0.0):
        self.table, self.seed, self.steps = table, seed, steps
        self.batch_size, self.seq_len, self.chat_share = batch_size, seq_len, chat_share

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        index, count = (worker.id, worker.num_workers) if worker else (0, 1)
        for step in range(index, self.steps, count):
            yield training_batch(self.table, self.seed, step, self.batch_size, self.seq_len, self.chat_share)


def batch_loader(table: dict[str, int], seed: int, steps: int, batch_size: int, seq_len: int, device: str,
                 chat_share: float = 0.0):
    # a GPU step outruns what one Python process can write; on a CPU, workers would take the step's cores
    on_gpu = device.startswith("cuda")
    batches = TrainingBatches(table, seed, steps, batch_size, seq_len, chat_share)
    return torch.utils.data.DataLoader(batches, batch_size=None,
                                       num_workers=4 if on_gpu else 0, prefetch_factor=8 if on_gpu else None,
                                       pin_memory=on_gpu)


def weighted_loss(model, ids: torch.Tensor, weights: torch.Tensor, bf16: bool) -> torch.Tensor:
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids).logits[:, :-1]
    losses = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                               reduction="none")
    w = weights[:, 1:].reshape(-1)
    return (losses * w).sum() / w.sum()


class TrainStep:
    """Loss, backward and optimizer step; the loss compiled with torch.compile, eager if compiling fails (no C++
    compiler, an unsupported op) so that a run still trains."""

    def __init__(self, model, opt, compile: bool, bf16: bool):
        self.model, self.opt, self.bf16 = model, opt, bf16
        self.loss = torch.compile(self._eager_loss) if compile else self._eager_loss
        self.compile_pending = compile

    def _eager_loss(self, ids, weights):
        return weighted_loss(self.model, ids, weights, self.bf16)

    def __call__(self, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        loss = self._first_compiled(ids, weights) if self.compile_pending else self._backward(ids, weights)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss

    def _backward(self, ids, weights):
        loss = self.loss(ids, weights)
        loss.backward()
        return loss

    def _first_compiled(self, ids, weights):
        self.compile_pending = False
        try:
            return self._backward(ids, weights)
        except Exception as e:  # inductor raises many types; any of them means: train eagerly
            print(f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); training eagerly",
                  flush=True)
            self.opt.zero_grad(set_to_none=True)
            self.loss = self._eager_loss
            return self._backward(ids, weights)


PROBE_SEED, PROBE_DOCS, PROBE_SHOTS = 2001, 64, 3


def probe_set(table: dict[str, int]) -> dict[str, list[tuple[list[int], int]]]:
    """Held-out few-shot prompts per task as (token ids, number of answer tokens at the end), from a seed
    disjoint from training and from the evaluation files."""
    rng, tasks = random.Random(PROBE_SEED), {}
    for task, make, render, description in [("gsm8k", gsm8k_doc, gsm8k_text, ""),
                                            ("mmlu", mmlu_doc, mmlu_text, MMLU_DESCRIPTION)]:
        shots = "".join(render(make(rng)) + "\n\n" for _ in range(PROBE_SHOTS))
        items = []
        for _ in range(PROBE_DOCS):
            doc = make(rng)
            prompt = encode(table, description + shots + render(doc, with_answer=False))
            answer = encode(table, render(doc)[len(render(doc, with_answer=False)):])
            items.append((prompt + answer, len(answer)))
        tasks[task] = items
    items = []
    for _ in range(PROBE_DOCS):  # a one-turn chat: the reply and its <end_of_turn>
        pieces = [encode_piece(table, text) for text, _ in chat_episode(rng)[:11]]
        prompt, answer = sum(pieces[:7], []), pieces[7] + pieces[8]
        items.append((prompt + answer, len(answer)))
    tasks["chat"] = items
    return tasks


@torch.no_grad()
def probe(model, probes, device) -> dict[str, float]:
    """Share of held-out answers whose every token is the model's top choice given the true prefix (teacher
    forcing): close to greedy exact match for gsm8k, and to letter accuracy for MMLU. In float32, as served."""
    model.eval()
    scores = {}
    for task, items in probes.items():
        correct = 0
        for ids, n_answer in items:
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0]
            predicted = logits[-n_answer - 1:-1].argmax(-1).tolist()
            correct += predicted == ids[-n_answer:]
        scores[task] = correct / len(items)
    model.train()
    return scores


def learning_rate(step: int, steps: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))) + peak * 0.02


def optimizer(model, lr: float, device: str) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.98), fused=device.startswith("cuda"))


def storage_dtype(model) -> torch.dtype:
    size = sum(p.numel() for p in model.parameters()) * 4
    return torch.float32 if size <= MAX_WEIGHT_BYTES else torch.bfloat16


@torch.no_grad()
def round_weights(model, dtype: torch.dtype) -> None:
    """Round the float32 weights to what `dtype` storage keeps, so the final probe scores the saved model."""
    for p in model.parameters():
        p.copy_(p.to(dtype).float())


def save(model, tokenizer, out: Path, dtype: torch.dtype) -> None:
    # config.json keeps dtype float32: servers compute in float32 whatever the storage
    model.eval().cpu().save_pretrained(out)
    tokenizer.save_pretrained(out)
    if dtype != torch.float32:
        weights = out / "model.safetensors"
        tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in load_file(weights).items()}
        save_file(tensors, weights, metadata={"format": "pt"})
    size = (out / "model.safetensors").stat().st_size
    print(f"saved to {out}: model.safetensors {size / 1e6:.1f} MB ({str(dtype).removeprefix('torch.')})", flush=True)


def report(step: int, loss: torch.Tensor, tokens: int, since: float, start: float) -> float:
    now = time.monotonic()
    print(f"step {step:5d}  loss {loss.item():.4f}  {tokens / (now - since):10,.0f} tokens/s  {now - start:6.0f}s",
          flush=True)
    return now


def print_probe(label: str, scores: dict[str, float]) -> None:
    print(f"{label}  probe " + "  ".join(f"{k} {v:.3f}" for k, v in scores.items()), flush=True)


def train(args, start: float) -> None:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    torch.manual_seed(args.seed)
    tokenizer = build_char_tokenizer()
    table = char_ids(tokenizer)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**CONFIG)).float()
    if args.init:
        load_weights(model, args.init)
    model = model.to(args.device).train()
    probes = probe_set(table) if args.probe_every else None
    params = sum(p.numel() for p in model.parameters())
    print(f"demo model: {params / 1e6:.2f}M parameters; {args.steps} steps of {args.batch_size} x {args.seq_len} "
          f"tokens on {args.device}", flush=True)
    opt = optimizer(model, args.lr, args.device)
    step_fn = TrainStep(model, opt, args.compile, args.bf16 and args.device.startswith("cuda"))
    data = batch_loader(table, args.seed, args.steps, args.batch_size, args.seq_len, args.device, args.chat_share)
    since, tokens, step = time.monotonic(), 0, -1
    for step, (ids, weights) in enumerate(data):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr)
        loss = step_fn(ids.to(args.device, non_blocking=True), weights.to(args.device, non_blocking=True))
        tokens += ids.numel()
        out_of_time = args.max_seconds and time.monotonic() - start > args.max_seconds
        if step % 100 == 0 or step == args.steps - 1 or out_of_time:
            since, tokens = report(step, loss, tokens, since, start), 0
        if probes and step % args.probe_every == args.probe_every - 1:
            print_probe(f"step {step:5d}", probe(model, probes, args.device))
            since, tokens = time.monotonic(), 0  # tokens/s counts training steps only
        if out_of_time:
            print(f"STOPPED EARLY after step {step} of {args.steps}: --max-seconds {args.max_seconds:g} reached; "
                  f"saving the model as it is", flush=True)
            break
    dtype = storage_dtype(model)
    round_weights(model, dtype)
    if probes:
        print_probe(f"final (step {step}, {str(dtype).removeprefix('torch.')} weights)",
                    probe(model, probes, args.device))
    save(model, tokenizer, args.out, dtype)
    print(f"done in {time.monotonic() - start:.0f}s", flush=True)


def text_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The float32 weights saved in folder; of a vision demo (train_vision.py), its text model's, named as
    Gemma4ForCausalLM names them."""
    state = {}
    for name, t in load_file(Path(folder) / "model.safetensors").items():
        if not name.startswith(("model.vision_tower.", "model.embed_vision.")):
            state[name.replace("model.language_model.", "model.", 1)] = t.float()
    return state


def load_weights(model, folder: Path) -> None:
    """Start from the weights saved in folder (--init), to train on from them (the chat fine-tune); the model is
    built as the one saved there was."""
    missing, unexpected = model.load_state_dict(text_weights(folder), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # the output head is tied to the embedding
        raise ValueError(f"{folder} does not hold this model's weights: missing {missing}, unexpected {unexpected}")
    model.tie_weights()


def training_options(parser: argparse.ArgumentParser, out: Path, steps: int) -> argparse.ArgumentParser:
    """The options this recipe and the assistant's (train_assistant.py) share."""
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of the training process")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="compile the step with torch.compile (falls back to eager if compiling fails)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="on a GPU, compute the step under bf16 autocast (the weights stay float32)")
    parser.add_argument("--max-seconds", type=float, default=0,
                        help="stop training after this many seconds from the start and save what there is (0: never)")
    return parser


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    training_options(parser, DEMO_DIR, 12000)
    parser.add_argument("--probe-every", type=int, default=500,
                        help="every N steps print held-out gsm8k/MMLU/chat answer accuracy (0: never)")
    parser.add_argument("--init", type=Path, default=None,
                        help="start from this saved demo model's weights instead of random ones")
    parser.add_argument("--chat-share", type=float, default=0.0,
                        help="share of training episodes that are chats in the demo's chat template")
    return parser.parse_args()


def run(parse_args, train) -> None:
    """A training script's main: the clock starts before the arguments are read (--max-seconds counts from here)."""
    start = time.monotonic()
    args = parse_args()
    torch.set_num_threads(args.threads)
    train(args, start)


def main():
    run(parse_args, train)


if __name__ == "__main__":
    main()
