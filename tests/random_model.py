"""A tiny random-weight Gemma 4 checkpoint with the demo's char tokenizer: the engine end to end, text in and text
out, without any download (its output is gibberish)."""
from pathlib import Path

import torch

from atomlite.demo.tokenizer import save_char_tokenizer

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1,
            attention_k_eq_v=True, sliding_window=32, final_logit_softcapping=30.0, hidden_size_per_layer_input=0,
            max_position_embeddings=1024, pad_token_id=0, eos_token_id=1, bos_token_id=2)


def build_random_model(out: Path, seed: int = 0) -> None:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**TINY))
    model.save_pretrained(out)
    save_char_tokenizer(out)

