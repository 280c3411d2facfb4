"""A character-level tokenizer (printable ASCII + newline) built offline with the tokenizers library, with Gemma 4's
image, video and audio tokens after the characters (ids 101-107), so the demo takes images as Gemma 4 does."""
import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
CHARS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))
# Gemma 4's multimodal tokens, in the ids after the characters (101..107 of the 128-entry vocabulary)
MEDIA_TOKENS = {"boi_token": "<|image>", "image_token": "<|image|>", "eoi_token": "<image|>",
                "video_token": "<|video|>", "audio_token": "<|audio|>", "boa_token": "<|audio>",
                "eoa_token": "<audio|>"}
# Plain chats render as the demo was trained; content parts as Gemma 4's template renders them (text trimmed, one
# <|image|> or <|video|> placeholder per image or video part, in place, for the processor to expand); tools, tool calls and results, and enable_thinking are written in
# Gemma 4's notation inside the demo's turns, so the server's Gemma 4 parsers and forced tool calls work on it.
GEMMA4_VALUE = (
    "{% macro value(v) %}{% if v is string %}<|\"|>{{ v }}<|\"|>{% elif v is boolean %}{{ 'true' if v else 'false' }}"
    "{% elif v is none %}null{% elif v is mapping %}{{ '{' }}{% for k in v | sort %}{{ k }}:{{ value(v[k]) }}"
    "{{ ',' if not loop.last }}{% endfor %}{{ '}' }}{% elif v is iterable %}[{% for x in v %}{{ value(x) }}"
    "{{ ',' if not loop.last }}{% endfor %}]{% else %}{{ v }}{% endif %}{% endmacro %}")
CHAT_TEMPLATE = GEMMA4_VALUE + (
    "{{ bos_token }}{% if tools or enable_thinking %}<start_of_turn>system\n{% if enable_thinking %}<|think|>"
    "{% endif %}{% for t in tools or [] %}<|tool>declaration:{{ t['function']['name'] }}"
    "{{ t['function'].get('parameters', {}) | tojson }}<tool|>{% endfor %}<end_of_turn>\n{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{% if m['role'] == 'tool' %}<|tool_response>response:"
    "{{ m.get('name') or 'tool' }}{value:<|\"|>{{ m['content'] }}<|\"|>}<tool_response|>"
    "{% elif m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% elif part['type'] == 'image' %}<|image|>"
    "{% elif part['type'] == 'video' %}<|video|>{% endif %}{% endfor %}{% endif %}{% for c in m.get('tool_calls') or [] %}<|tool_call>call:{{ c['function']['name'] }}"
    "{{ value(c['function']['arguments']) }}<tool_call|>{% endfor %}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>assistant\n{% endif %}")


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    media = list(MEDIA_TOKENS.values())
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS + media)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIALS + media)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                  additional_special_tokens=SPECIALS[3:] + media)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_char_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    tok = build_char_tokenizer()
    tok.save_pretrained(out)
    return tok
