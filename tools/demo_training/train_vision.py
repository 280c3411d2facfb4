"""Give the bundled demo model eyes: a tiny Gemma 4 vision tower (the 31B family's shape: standardized soft tokens,
bidirectional attention over each image's tokens in the sliding layers), trained with transformers' own
Gemma4ForConditionalGeneration on synthetic pictures (vision_data.py: the colour and the count of shapes), starting
from the demo's committed text weights.

    python -m tools.demo_training.train_vision --device cuda --steps 6000 --max-seconds 250
    python -m tools.demo_training.train_vision --device cpu --steps 3 --batch-size 4 --out /tmp/vision  # a quick check

The text model trains too, at --text-lr (a tenth of the tower's rate), with a batch of the text recipe's data
(train.py, 30% chats) in every step beside the pictures, so its arithmetic stays. --no-train-text freezes it (only
the tower and its projection learn): on the GPU that run's held-out answers stayed at 0.0 after 1900 steps, while
training both reached 0.95 by step 1000. Each step's batch depends only on the seed and the step number, as in
train.py; under --max-seconds the learning-rate schedule runs on the time spent, so the steps a run makes depend on
the machine. The folder written holds the model (config.json of a Gemma4ForConditionalGeneration), the tokenizer
with Gemma 4's vision tokens, and processor_config.json, whose max_soft_tokens (70) keeps an image at 64-70 tokens.
"""
import argparse
import json
import random
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from atomlite.accuracy.vqa_pictures import TRAIN_SEED, Picture, picture, question
from atomlite.demo import DEMO_DIR
from atomlite.demo.tokenizer import MEDIA_TOKENS, build_char_tokenizer
from tools.demo_training.train import (CONFIG, char_ids, encode, learning_rate, print_probe, probe, probe_set, report,
                                       round_weights, run, training_batch, training_options)
from tools.demo_training.train import save as save_model

MAX_SOFT_TOKENS = 70
# Longest side at any max_soft_tokens a request may ask for (1120 x the 3 x 3 pooling), in patches
POSITIONS = 1120 * 3
VISION_CONFIG = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=3, num_attention_heads=2,
                     num_key_value_heads=2, head_dim=32, standardize=True, position_embedding_size=POSITIONS,
                     default_output_length=MAX_SOFT_TOKENS, patch_size=16, pooling_kernel_size=3)
PROBE_SEED, PROBE_ITEMS = 2101, 96
SPECIAL = {"<bos>": 2, "<start_of_turn>": 3, "<end_of_turn>": 4}


def token_ids(tokenizer) -> dict[str, int]:
    return {role.removesuffix("_token"): tokenizer.convert_tokens_to_ids(text) for role, text in MEDIA_TOKENS.items()}


def model_config(tokenizer):
    from transformers import Gemma4Config, Gemma4TextConfig, Gemma4VisionConfig
    ids = token_ids(tokenizer)
    text = Gemma4TextConfig(**CONFIG, use_bidirectional_attention="vision")
    return Gemma4Config(text_config=text.to_dict(), vision_config=Gemma4VisionConfig(**VISION_CONFIG).to_dict(),
                        image_token_id=ids["image"], video_token_id=ids["video"], boi_token_id=ids["boi"],
                        eoi_token_id=ids["eoi"], audio_token_id=ids["audio"], boa_token_id=ids["boa"],
                        eoa_token_index=ids["eoa"])


def drawn_chat(rng: random.Random) -> tuple[Picture, str, str, bool]:
    """(picture, question, answer, whether the picture comes before the question)."""
    p = picture(rng)
    q, a = question(rng, p)
    return p, q, a, rng.random() < 0.8


def chat_example(table: dict[str, int], ids: dict[str, int], chat: tuple[Picture, str, str, bool], spec) \
        -> tuple[list[int], list[float], object]:
    """One user turn with a picture and a question, then the answer, as the template and the processor render
    them: (token ids, loss weight of predicting each token, the picture's ImageItem). Only the answer and its
    <end_of_turn> weigh."""
    from atomlite.multimodal.items import image_item
    p, q, a, picture_first = chat
    item = image_item(p.image, spec, "picture")
    image = [ids["boi"]] + [ids["image"]] * item.num_soft_tokens + [ids["eoi"]]
    user = image + encode(table, q) if picture_first else encode(table, q) + image
    prompt = ([SPECIAL["<bos>"], SPECIAL["<start_of_turn>"]] + encode(table, "user\n") + user
              + [SPECIAL["<end_of_turn>"]] + encode(table, "\n") + [SPECIAL["<start_of_turn>"]]
              + encode(table, "assistant\n"))
    reply = encode(table, a) + [SPECIAL["<end_of_turn>"]]
    return prompt + reply, [0.0] * len(prompt) + [1.0] * len(reply), item


def image_batch(table, ids, rng: random.Random, batch_size: int) -> dict[str, torch.Tensor]:
    """Right-padded chats (pad id 0, weight 0) with their pixels: what Gemma4ForConditionalGeneration takes."""
    from atomlite.multimodal.patches import PatchSpec
    spec = PatchSpec(max_soft_tokens=MAX_SOFT_TOKENS)
    examples = [chat_example(table, ids, drawn_chat(rng), spec) for _ in range(batch_size)]
    length = max(len(e[0]) for e in examples)
    input_ids = torch.tensor([e[0] + [0] * (length - len(e[0])) for e in examples])
    return {"input_ids": input_ids,
            "weights": torch.tensor([e[1] + [0.0] * (length - len(e[1])) for e in examples]),
            # the pixels as their 0..255 levels: a quarter of float32's bytes between processes (device_batch)
            "pixel_levels": torch.stack([(e[2].pixel_values * 255).round().to(torch.uint8) for e in examples]),
            "image_position_ids": torch.stack([e[2].image_position_ids for e in examples]),
            "mm_token_type_ids": (input_ids == ids["image"]).long()}


class VisionBatches(torch.utils.data.IterableDataset):
    """Step s's picture batch (and, with text_batch, the text recipe's batch of step s); worker w of W makes steps
    w, w+W, ..."""

    def __init__(self, seed: int, steps: int, batch_size: int, text_batch: int, text_len: int):
        self.seed, self.steps, self.batch_size = seed, steps, batch_size
        self.text_batch, self.text_len = text_batch, text_len

    def __iter__(self):
        tokenizer = build_char_tokenizer()
        table, ids = char_ids(tokenizer), token_ids(tokenizer)
        worker = torch.utils.data.get_worker_info()
        index, count = (worker.id, worker.num_workers) if worker else (0, 1)
        for step in range(index, self.steps, count):
            batch = image_batch(table, ids, random.Random(f"{TRAIN_SEED}/{self.seed}/{step}"), self.batch_size)
            if self.text_batch:
                batch["text_ids"], batch["text_weights"] = training_batch(table, self.seed, step, self.text_batch,
                                                                          self.text_len, chat_share=0.3)
            yield batch


def device_batch(batch: dict, device: str) -> dict[str, torch.Tensor]:
    """The batch on the device, its pixel levels back to the processor's float32 values (the same table)."""
    from atomlite.multimodal.patches import _UNIT_SCALE
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items() if k != "pixel_levels"}
    out["pixel_values"] = torch.from_numpy(_UNIT_SCALE).to(device)[batch["pixel_levels"].to(device).long()]
    return out


def weighted_loss(logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                               ids[:, 1:].reshape(-1), reduction="none")
    w = weights[:, 1:].reshape(-1)
    return (losses * w).sum() / w.sum()


def step_loss(model, batch: dict, bf16: bool) -> torch.Tensor:
    with torch.autocast(batch["input_ids"].device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"],
                       image_position_ids=batch["image_position_ids"],
                       mm_token_type_ids=batch["mm_token_type_ids"]).logits
        loss = weighted_loss(logits, batch["input_ids"], batch["weights"])
        if "text_ids" in batch:
            loss = loss + weighted_loss(model(input_ids=batch["text_ids"]).logits, batch["text_ids"],
                                        batch["text_weights"])
    return loss


def vqa_probes(tokenizer) -> list[dict]:
    """Held-out pictures and questions (a seed apart from training's and the accuracy job's), one batch each."""
    table, ids, rng = char_ids(tokenizer), token_ids(tokenizer), random.Random(PROBE_SEED)
    return [image_batch(table, ids, rng, 1) for _ in range(PROBE_ITEMS)]


@torch.no_grad()
def vqa_probe(model, probes: list[dict], device: str) -> float:
    """Share of held-out answers (with their <end_of_turn>) whose every token is the model's top choice given the
    true prefix, in float32."""
    model.eval()
    correct = 0
    for batch in probes:
        batch = device_batch(batch, device)
        logits = model(**{k: v for k, v in batch.items() if k != "weights"}).logits[0]
        answer = batch["weights"][0].nonzero().flatten()
        correct += bool((logits[answer - 1].argmax(-1) == batch["input_ids"][0, answer]).all())
    model.train()
    return correct / len(probes)


def load_init(model, folder: Path) -> None:
    """The text weights of a text-only demo (model.* -> model.language_model.*), or a vision demo's whole."""
    state = {name: t.float() for name, t in load_file(Path(folder) / "model.safetensors").items()}
    if not any(name.startswith("model.language_model.") for name in state):
        state = {name.replace("model.", "model.language_model.", 1): t for name, t in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [n for n in missing if n != "lm_head.weight" and not n.startswith(("model.vision_tower.",
                                                                                 "model.embed_vision."))]
    if unexpected or missing:
        raise ValueError(f"{folder} does not hold the demo's weights: missing {missing}, unexpected {unexpected}")
    model.tie_weights()


def optimizer(model, args) -> torch.optim.AdamW:
    groups = []
    for params, lr in [([p for n, p in model.named_parameters() if "language_model" not in n], args.lr),
                       ([p for n, p in model.named_parameters() if "language_model" in n], args.text_lr)]:
        params = [p for p in params if p.requires_grad]
        groups += [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.05, "peak": lr},
                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "peak": lr}]
    return torch.optim.AdamW([g for g in groups if g["params"]], betas=(0.9, 0.98),
                             fused=args.device.startswith("cuda"))


def save(model, tokenizer, out: Path) -> None:
    """bf16 weights (the text model's were already), float32 compute (config.json), and the processor's config."""
    save_model(model, tokenizer, out, torch.bfloat16)
    processor = {"processor_class": "Gemma4Processor",
                 "image_processor": {"image_processor_type": "Gemma4ImageProcessor", "patch_size": 16,
                                     "pooling_kernel_size": 3, "max_soft_tokens": MAX_SOFT_TOKENS,
                                     "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255,
                                     "do_normalize": False, "do_convert_rgb": True}}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")


def train(args, start: float) -> None:
    from transformers import Gemma4ForConditionalGeneration
    torch.manual_seed(args.seed)
    tokenizer = build_char_tokenizer()
    model = Gemma4ForConditionalGeneration(model_config(tokenizer)).float()
    load_init(model, args.init)
    model.model.language_model.requires_grad_(args.train_text)
    model = model.to(args.device).train()
    text_probes, probes = probe_set(char_ids(tokenizer)), vqa_probes(tokenizer)
    print_probe("start", probe(model, text_probes, args.device))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"demo vision: {trainable / 1e6:.2f}M parameters trained (text model "
          f"{'trained' if args.train_text else 'frozen'}); {args.steps} steps of {args.batch_size} pictures on "
          f"{args.device}", flush=True)
    opt = optimizer(model, args)
    on_gpu = args.device.startswith("cuda")
    data = torch.utils.data.DataLoader(
        VisionBatches(args.seed, args.steps, args.batch_size, args.text_batch if args.train_text else 0, args.seq_len),
        batch_size=None, num_workers=args.workers if on_gpu else 0, prefetch_factor=4 if on_gpu else None,
        pin_memory=on_gpu)
    bf16 = args.bf16 and on_gpu
    since = began = time.monotonic()
    step = -1
    # under --max-seconds the schedule runs on the share of the time spent where that is ahead of the steps, so a
    # run that cannot finish its steps still ends its cosine (a minute is left to probe and save)
    budget = args.max_seconds - (began - start) - 60 if args.max_seconds else 0
    for step, batch in enumerate(data):
        progress = max(step, args.steps * (time.monotonic() - began) / budget) if budget > 0 else step
        for group in opt.param_groups:
            group["lr"] = learning_rate(int(progress), args.steps, group["peak"])
        batch = device_batch(batch, args.device)
        opt.zero_grad(set_to_none=True)
        loss = step_loss(model, batch, bf16)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        out_of_time = budget > 0 and progress >= args.steps
        if step % 100 == 0 or step == args.steps - 1 or out_of_time:
            since = report(step, loss, batch["input_ids"].numel(), since, start)
        if args.probe_every and step % args.probe_every == args.probe_every - 1:
            print(f"step {step:5d}  vqa probe {vqa_probe(model, probes, args.device):.3f}", flush=True)
        if out_of_time:
            print(f"STOPPED EARLY after step {step} of {args.steps}: --max-seconds {args.max_seconds:g} reached "
                  f"(the schedule ran on time); saving the model", flush=True)
            break
    round_weights(model, torch.bfloat16)
    print(f"final (step {step}, bf16 weights)  vqa probe {vqa_probe(model, probes, args.device):.3f}", flush=True)
    print_probe("final", probe(model, text_probes, args.device))
    save(model, tokenizer, args.out)
    print(f"done in {time.monotonic() - start:.0f}s", flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    training_options(parser, DEMO_DIR, 3000)
    parser.set_defaults(compile=False, seq_len=256)
    parser.add_argument("--init", type=Path, default=DEMO_DIR,
                        help="the demo whose text weights to start from (a text-only or a vision demo folder)")
    parser.add_argument("--train-text", action=argparse.BooleanOptionalAction, default=True,
                        help="train the text model too (at --text-lr, with the text recipe's batches mixed in); "
                             "--no-train-text freezes it")
    parser.add_argument("--text-lr", type=float, default=1e-4)
    parser.add_argument("--text-batch", type=int, default=8, help="text rows of --seq-len tokens per step")
    parser.add_argument("--workers", type=int, default=6, help="data workers on a GPU")
    parser.add_argument("--probe-every", type=int, default=500,
                        help="every N steps print held-out picture-question accuracy (0: never)")
    return parser.parse_args()


def main():
    run(parse_args, train)


if __name__ == "__main__":
    main()
