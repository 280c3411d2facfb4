"""A served folder for benchmarking a config-only checkpoint over HTTP with images:

    python -m atomlite.benchmarks.bench_checkpoint examples/configs/<a config with vision_config> /tmp/served
    atomlite serve /tmp/served --load-format dummy ...; atomlite bench serve --model /tmp/served --images-per-prompt 1

The chat endpoint needs a tokenizer and a chat template, which examples/configs does not ship (the real ones are
the hub's). This writes config.json beside a character-level tokenizer whose special tokens sit at the ids the
config names (pad, eos, bos, image, video, boi, eoi), and a chat template that writes one image placeholder per
image part as the multimodal checkpoints' templates do. Token ids change nothing a dummy-weight model computes; prompt lengths come out as
one token per character (a tiny vocabulary keeps the newline, space and lowercase letters first)."""
import argparse
import json
import shutil
import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

TURN_TOKENS = ("<start_of_turn>", "<end_of_turn>")
VISION_TOKENS = {"boi_token_id": "<|image>", "image_token_id": "<|image|>", "eoi_token_id": "<image|>",
                 "video_token_id": "<|video|>"}
# the characters in the order a small vocabulary keeps them: what the template and random prompts write first
FIRST_CHARS = "\n abcdefghijklmnopqrstuvwxyz"
CHARS = list(FIRST_CHARS) + sorted(set(string.printable) - set("\t\r\x0b\x0c") - set(FIRST_CHARS))
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% elif part['type'] == 'image' %}<|image|>"
    "{% elif part['type'] == 'video' %}<|video|>{% endif %}{% endfor %}{% endif %}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>assistant\n{% endif %}")


def special_token_ids(config: dict) -> dict[str, int]:
    """Each special token's id: the config's for pad, eos, bos and the vision tokens; the turn markers after the
    characters."""
    text = config.get("text_config") or config
    eos = text.get("eos_token_id", 1)
    ids = {"<pad>": text.get("pad_token_id", 0), "<eos>": eos[0] if isinstance(eos, list) else eos,
           "<bos>": text.get("bos_token_id", 2)}
    ids.update({token: config[key] for key, token in VISION_TOKENS.items() if key in config})
    first_free = max(ids.values()) + 1
    ids.update({token: first_free + i for i, token in enumerate(TURN_TOKENS)})
    return ids


def char_vocab(specials: dict[str, int], vocab_size: int) -> dict[str, int]:
    """The characters at the ids from 3 up that the specials leave free, as many as the vocabulary holds."""
    free = sorted(set(range(3, vocab_size)) - set(specials.values()))
    return dict(zip(CHARS, free))


def write_bench_checkpoint(config_dir: Path, out: Path) -> Path:
    from transformers import PreTrainedTokenizerFast
    config = json.loads((config_dir / "config.json").read_text())
    vocab_size = (config.get("text_config") or config)["vocab_size"]
    specials = special_token_ids(config)
    if max(specials.values()) >= vocab_size or vocab_size - len(specials) < 30:
        raise ValueError(f"{config_dir}: a vocabulary of {vocab_size} cannot hold the special token ids {specials} "
                         f"and the letters")
    vocab = {**char_vocab(specials, vocab_size), **specials}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(specials))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                        bos_token="<bos>", additional_special_tokens=list(specials)[3:])
    tokenizer.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    for f in config_dir.iterdir():
        if f.is_file() and f.suffix == ".json":
            shutil.copy(f, out / f.name)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_dir", type=Path, help="a folder with config.json (examples/configs/...)")
    parser.add_argument("out", type=Path, help="the folder to write")
    args = parser.parse_args()
    print(write_bench_checkpoint(args.config_dir, args.out))


if __name__ == "__main__":
    main()
