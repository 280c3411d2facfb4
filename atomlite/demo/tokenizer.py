"""A character-level tokenizer (printable ASCII + newline) built offline with the tokenizers library."""
import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
CHARS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>assistant\n{% endif %}")


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                  additional_special_tokens=SPECIALS[3:])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_char_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    tok = build_char_tokenizer()
    tok.save_pretrained(out)
    return tok
