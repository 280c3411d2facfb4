"""Train the demo model's speculative-decoding assistant: a tiny Gemma4AssistantForCausalLM (an MTP drafter) that
drafts tokens for the frozen demo model in atomlite/demo/model.

    python -m tools.demo_training.train_assistant --device cuda [--max-seconds 220] [--out atomlite/demo/assistant]

What it learns is what a draft round does at inference. A round starts at the newest token x_p (position p); the
target holds K/V for positions 0..p-1 and its final-normed hidden state h_{p-1}, the one that predicted x_p. Step 1
feeds cat([E(x_p), h_{p-1}]) (E: the target's scaled input embedding) at position p; every assistant layer reads the
K/V of the target's last layer of its kind (full: keys 0..p-1; sliding: keys p-W+1..p-1, W the target's window),
and the step returns logits for x_{p+1} and g_1 = post_projection(hidden). Step j > 1 feeds cat([E(d_{j-1}), g_{j-1}])
at the same position with the same keys and predicts x_{p+j}.

Training runs every round start p of a sequence at once (one query per p, a mask per query), unrolls DRAFTS steps
with the data token x_{p+j-1} as step j's token input and the assistant's own g_{j-1} as its state, and scores step j
against the frozen target's greedy token at position p+j-1 (its argmax given x_0..x_{p+j-1}), not against the data
token x_{p+j}. Greedy verification accepts a draft exactly when it equals that argmax, so this is the quantity to
learn; where the data is random (names, operands of a new question) the argmax is a learnable function of the
context while the data token is noise, and where the target is sure (answers) the two agree.

The defaults train 3000 steps of 32 x 512 tokens, lr 1e-3 cosine, bf16 autocast on a GPU, the step compiled with
torch.compile (eager if that fails), seeded like tools/demo_training/train.py. At the end it prints a held-out mean
accepted length at DRAFTS drafts (1 + accepted drafts per round, greedy verification) on few-shot gsm8k/MMLU prompts,
chats and the README's question, measured on the target's own greedy continuations, then saves config.json and
model.safetensors (bf16 storage, config dtype float32 like the demo model). The shipped weights trained on from the
defaults' against the chat-tuned demo model (--init, --chat-share; docs/DEMO_MODEL.md has the command).
"""
import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from atomlite.demo import DEMO_ASSISTANT_DIR, DEMO_DIR
from atomlite.demo.tokenizer import build_char_tokenizer
from tools.demo_training.train import (TrainStep, batch_loader, char_ids, encode, learning_rate, load_weights,
                                       optimizer, probe_set, round_weights, run, training_options)

ASSISTANT_SIZE = dict(hidden_size=128, intermediate_size=512, num_attention_heads=4,
                      layer_types=["sliding_attention", "full_attention"])
DRAFTS = 4
MAX_ASSISTANT_BYTES = 4 * 10**6  # the committed model.safetensors stays this small
README_QUESTION = "Ava has 7 pens and gets 5 more. How many pens does Ava have now?"
IGNORE = -100


def last_layer_of_each_kind(target_config) -> dict[str, object]:
    """The per-layer config of the target layer whose K/V each assistant layer of that kind reads: the last one of
    the kind (a later layer overwrites an earlier one here)."""
    return {kind: target_config.per_layer_config[i] for i, kind in enumerate(target_config.layer_types)}


def assistant_config(target_config):
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig
    kinds = last_layer_of_each_kind(target_config)
    sliding, full = kinds["sliding_attention"], kinds["full_attention"]
    text = Gemma4TextConfig(
        **ASSISTANT_SIZE, num_hidden_layers=len(ASSISTANT_SIZE["layer_types"]),
        num_kv_shared_layers=len(ASSISTANT_SIZE["layer_types"]), vocab_size=target_config.vocab_size,
        head_dim=sliding.head_dim, num_key_value_heads=sliding.num_key_value_heads, global_head_dim=full.head_dim,
        num_global_key_value_heads=full.num_key_value_heads, attention_k_eq_v=target_config.attention_k_eq_v,
        sliding_window=target_config.sliding_window, rope_parameters=target_config.rope_parameters,
        max_position_embeddings=target_config.max_position_embeddings, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, pad_token_id=target_config.pad_token_id,
        eos_token_id=target_config.eos_token_id, bos_token_id=target_config.bos_token_id)
    return Gemma4AssistantConfig(text_config=text, backbone_hidden_size=target_config.hidden_size,
                                 use_ordered_embeddings=False, tie_word_embeddings=True,
                                 architectures=["Gemma4AssistantForCausalLM"])


def load_target(path: Path, device: str):
    """The demo's text model (of a vision demo too: the assistant drafts text)."""
    from transformers import AutoConfig, Gemma4ForCausalLM
    target = Gemma4ForCausalLM(AutoConfig.from_pretrained(path).get_text_config()).float()
    load_weights(target, path)
    return target.to(device).eval().requires_grad_(False)


def build_assistant(target, device: str):
    from transformers import Gemma4AssistantForCausalLM
    # the training masks are boolean "may attend" masks, the form sdpa takes
    assistant = Gemma4AssistantForCausalLM(assistant_config(target.config))
    assistant.set_attn_implementation("sdpa")
    assistant.generation_config.num_assistant_tokens = DRAFTS
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    return assistant.to(device).train()


@dataclass(slots=True)
class TargetPass:
    """What a draft round reads from the frozen target, for every position of a batch of sequences."""
    shared_kv: dict[str, tuple[torch.Tensor, torch.Tensor]]  # the last layer of each kind: (B, kv heads, T, dim)
    hidden: torch.Tensor  # (B, T, hidden): final-normed; hidden[:, t] predicted the token at t + 1
    greedy: torch.Tensor  # (B, T): the target's argmax at each position, its greedy next token
    window: int  # the target's sliding window


@torch.no_grad()
def target_pass(target, ids: torch.Tensor) -> TargetPass:
    # the base model's last_hidden_state is the final-normed state (the full model's hidden_states[-1]), without
    # the output capture hooks that break torch.compile's graph; softcapping keeps the argmax, so it is skipped
    out = target.model(input_ids=ids, return_shared_kv_states=True, use_cache=False)
    return TargetPass(dict(out.shared_kv_states), out.last_hidden_state,
                      target.lm_head(out.last_hidden_state).argmax(-1), target.config.sliding_window)


def draft_masks(seq_len: int, window: int, device) -> dict[str, torch.Tensor]:
    """Boolean (1, 1, T-1, T) masks: row p-1 is the round starting at p = 1..T-1, which sees the target's keys
    before p; on sliding layers only the last window-1 of them (the target's own query at p would see W keys, p
    among them, and p is not cached yet)."""
    starts = torch.arange(1, seq_len, device=device)[:, None]
    keys = torch.arange(seq_len, device=device)[None, :]
    before = keys < starts
    in_window = before & (starts - keys < window)
    return {"full_attention": before[None, None], "sliding_attention": in_window[None, None]}


def ahead(tokens: torch.Tensor, j: int, fill: int) -> torch.Tensor:
    """For the rounds starting at p = 1..T-1: the token at position p + j - 1, `fill` past the end."""
    return F.pad(tokens[:, j:], (0, j - 1), value=fill)


def draft_step(assistant, inputs: torch.Tensor, positions: torch.Tensor, masks: dict[str, torch.Tensor],
               shared_kv: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft step for many rounds at once: Gemma4AssistantForCausalLM.forward with a mask per query."""
    # logits_to_keep=None: every query is a round to keep, and transformers' int path (slicing the queries before
    # KV-shared layers) fails on more than one query without per-layer inputs
    hidden = assistant.model(inputs_embeds=assistant.pre_projection(inputs), attention_mask=masks,
                             position_ids=positions, shared_kv_states=dict(shared_kv), use_cache=False,
                             logits_to_keep=None).last_hidden_state
    return assistant.lm_head(hidden), assistant.post_projection(hidden)


def draft_logits(assistant, embed, seen: TargetPass, ids: torch.Tensor, drafts: int,
                 teacher_forced: bool) -> list[torch.Tensor]:
    """Logits (B, T-1, vocab) of draft steps 1..drafts of the rounds starting at p = 1..T-1. Step j's token input is
    the data token x_{p+j-1} (teacher_forced) or the assistant's own previous draft."""
    seq_len = ids.shape[1]
    masks = draft_masks(seq_len, seen.window, ids.device)
    positions = torch.arange(1, seq_len, device=ids.device)[None]
    tokens, state = ids[:, 1:], seen.hidden[:, :-1]
    steps = []
    for j in range(1, drafts + 1):
        logits, state = draft_step(assistant, torch.cat([embed(tokens), state], -1), positions, masks,
                                   seen.shared_kv)
        steps.append(logits)
        tokens = ahead(ids, j + 1, 0) if teacher_forced else logits.argmax(-1)
    return steps


def drafting_loss(assistant, target, ids: torch.Tensor, bf16: bool, drafts: int = DRAFTS) -> torch.Tensor:
    """Mean over draft steps of the cross-entropy against the target's greedy token, over every round start."""
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        seen = target_pass(target, ids)
        steps = draft_logits(assistant, target.get_input_embeddings(), seen, ids, drafts, teacher_forced=True)
    losses = [F.cross_entropy(logits.float().flatten(0, 1), ahead(seen.greedy, j, IGNORE).flatten(),
                              ignore_index=IGNORE) for j, logits in enumerate(steps, 1)]
    return torch.stack(losses).mean()


class DraftTrainStep(TrainStep):
    """train.py's step (compiled, eager if compiling fails) on the drafting loss; the frozen target runs inside."""

    def __init__(self, assistant, target, opt, compile: bool, bf16: bool):
        self.target = target
        super().__init__(assistant, opt, compile, bf16)

    def _eager_loss(self, ids, weights):
        # weights go unused: every drafted token counts the same, the data's answer weights are the target's
        return drafting_loss(self.model, self.target, ids, self.bf16)


def held_out_prompts(table: dict[str, int], per_task: int) -> dict[str, list[list[int]]]:
    """Few-shot gsm8k and MMLU prompts from train.py's held-out probe seed, and the README's question as a
    completion and as a chat."""
    prompts = {task: [ids[:-n_answer] for ids, n_answer in items[:per_task]]
               for task, items in probe_set(table).items()}
    tokenizer = build_char_tokenizer()
    chat = tokenizer.apply_chat_template([{"role": "user", "content": README_QUESTION}], add_generation_prompt=True,
                                         tokenize=False)
    prompts["readme"] = [encode(table, f"Question: {README_QUESTION}\nAnswer:")]
    prompts["readme-chat"] = [tokenizer.encode(chat, add_special_tokens=False)]
    return prompts


@torch.no_grad()
def greedy_continuations(target, prompts: list[list[int]], new_tokens: int, device) -> torch.Tensor:
    """(B, longest prompt + new_tokens): each prompt followed by the target's greedy tokens, padded on the right.
    No KV cache: padding on the right cannot reach a real position through causal attention, so one batch serves
    prompts of any length exactly."""
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    ids = torch.zeros(len(prompts), int(lengths.max()) + new_tokens, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, :len(prompt)] = torch.tensor(prompt, device=device)
    rows = torch.arange(len(prompts), device=device)
    for _ in range(new_tokens):
        logits = target(input_ids=ids[:, :int(lengths.max())], use_cache=False).logits
        ids[rows, lengths] = logits[rows, lengths - 1].argmax(-1)
        lengths += 1
    return ids


@torch.no_grad()
def accepted_drafts(assistant, target, ids: torch.Tensor, drafts: int = DRAFTS) -> torch.Tensor:
    """(B, T-1): for the round starting at p = 1..T-1, how many of the assistant's drafts (each step fed its own
    previous draft) greedy verification accepts: the leading drafts equal to the target's greedy tokens."""
    seen = target_pass(target, ids)
    steps = draft_logits(assistant, target.get_input_embeddings(), seen, ids, drafts, teacher_forced=False)
    hits = torch.stack([logits.argmax(-1) == ahead(seen.greedy, j, IGNORE) for j, logits in enumerate(steps, 1)], -1)
    return hits.int().cumprod(-1).sum(-1)


def round_lengths(accepted: list[int], first: int, end: int, drafts: int = DRAFTS) -> list[int]:
    """Tokens each round of greedy speculative decoding yields (1 + accepted drafts) on a sequence whose tokens from
    `first` (the first generated one) to `end` are the target's greedy choices; only rounds whose drafts all fall
    before `end` count. accepted[p - 1]: the accepted drafts of the round starting at p."""
    lengths, p = [], first
    while p + drafts <= end:
        lengths.append(accepted[p - 1] + 1)
        p += lengths[-1]
    return lengths


def mean_accepted_length(assistant, target, prompts: dict[str, list[list[int]]], new_tokens: int,
                         device) -> dict[str, float]:
    """Per prompt set and overall: tokens per round when the assistant drafts DRAFTS tokens for the target's
    greedy continuation of each prompt. In float32, as served; all prompts in one batch."""
    tasks = [task for task, task_prompts in prompts.items() for _ in task_prompts]
    flat = [prompt for task_prompts in prompts.values() for prompt in task_prompts]
    assistant.eval()
    ids = greedy_continuations(target, flat, new_tokens, device)
    accepted = accepted_drafts(assistant, target, ids).tolist()
    assistant.train()
    rounds: dict[str, list[int]] = {task: [] for task in dict.fromkeys(tasks)}
    for task, prompt, row in zip(tasks, flat, accepted):
        rounds[task] += round_lengths(row, len(prompt), len(prompt) + new_tokens)
    rounds["all"] = [n for task_rounds in list(rounds.values()) for n in task_rounds]
    return {task: sum(n) / len(n) for task, n in rounds.items()}


def save_assistant(assistant, out: Path) -> None:
    """config.json and model.safetensors in bf16; config.json keeps dtype float32, as the demo model's does."""
    assistant.eval().cpu().save_pretrained(out)
    weights = out / "model.safetensors"
    tensors = {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    size = weights.stat().st_size
    if size > MAX_ASSISTANT_BYTES:
        raise SystemExit(f"{weights} is {size / 1e6:.1f} MB, over the {MAX_ASSISTANT_BYTES / 1e6:.0f} MB kept in the "
                         f"repository: make ASSISTANT_SIZE smaller")
    print(f"saved to {out}: model.safetensors {size / 1e6:.2f} MB (bfloat16)", flush=True)


def report(step: int, loss: torch.Tensor, done: int, total: int, since: float, start: float) -> float:
    """Prints the loss and the speed of the last `done` steps, with the time the remaining steps take at it."""
    now = time.monotonic()
    rate = done / (now - since)
    print(f"step {step:5d}  loss {loss.item():.4f}  {rate:6.1f} steps/s  {now - start:6.0f}s  "
          f"(~{(total - step - 1) / rate:.0f}s of training to go)", flush=True)
    return now


def print_accepted(label: str, lengths: dict[str, float]) -> None:
    print(f"{label}  mean accepted length at {DRAFTS} drafts: "
          + "  ".join(f"{task} {n:.2f}" for task, n in lengths.items()), flush=True)


def train(args, start: float) -> list[float]:
    """Trains, prints the held-out mean accepted length, saves; returns the loss of every step."""
    torch.manual_seed(args.seed)
    table = char_ids(build_char_tokenizer())
    target = load_target(args.target, args.device)
    assistant = build_assistant(target, args.device)
    if args.init:
        load_weights(assistant, args.init)
    params = sum(p.numel() for p in assistant.parameters())
    print(f"assistant: {params / 1e6:.2f}M parameters; {args.steps} steps of {args.batch_size} x {args.seq_len} "
          f"tokens, {DRAFTS} draft steps each, on {args.device}", flush=True)
    opt = optimizer(assistant, args.lr, args.device)
    step_fn = DraftTrainStep(assistant, target, opt, args.compile, args.bf16 and args.device.startswith("cuda"))
    data = batch_loader(table, args.seed, args.steps, args.batch_size, args.seq_len, args.device, args.chat_share)
    losses, since, last = [], time.monotonic(), -1
    for step, (ids, _) in enumerate(data):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr)
        loss = step_fn(ids.to(args.device, non_blocking=True), None)
        out_of_time = args.max_seconds and time.monotonic() - start > args.max_seconds
        losses.append(loss.detach())
        if step in (0, 20, 50) or step % 250 == 0 or step == args.steps - 1 or out_of_time:
            since, last = report(step, loss, step - last, args.steps, since, start), step
        if out_of_time:
            print(f"STOPPED EARLY after step {step} of {args.steps}: --max-seconds {args.max_seconds:g} reached; "
                  f"saving the assistant as it is", flush=True)
            break
    round_weights(assistant, torch.bfloat16)
    prompts = held_out_prompts(table, args.eval_prompts)
    print_accepted(f"held-out (bf16 weights, {args.eval_tokens} greedy tokens per prompt)",
                   mean_accepted_length(assistant, target, prompts, args.eval_tokens, args.device))
    save_assistant(assistant, args.out)
    print(f"done in {time.monotonic() - start:.0f}s", flush=True)
    return torch.stack(losses).tolist()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    training_options(parser, DEMO_ASSISTANT_DIR, 3000)
    parser.add_argument("--target", type=Path, default=DEMO_DIR, help="the frozen model the assistant drafts for")
    parser.add_argument("--eval-prompts", type=int, default=64,
                        help="held-out gsm8k and MMLU prompts each (at most 64) for the final accepted-length "
                             "measure, besides the README's question")
    parser.add_argument("--eval-tokens", type=int, default=48, help="greedy tokens generated after each prompt")
    parser.add_argument("--init", type=Path, default=None,
                        help="start from this saved assistant's weights (to train on against a changed target)")
    parser.add_argument("--chat-share", type=float, default=0.0,
                        help="share of training episodes that are chats in the demo's chat template")
    args = parser.parse_args(argv)
    if args.eval_tokens < DRAFTS:
        parser.error(f"--eval-tokens {args.eval_tokens} leaves no full round of {DRAFTS} drafts: "
                     f"pass at least {DRAFTS}")
    return args


def main():
    run(parse_args, train)


if __name__ == "__main__":
    main()
