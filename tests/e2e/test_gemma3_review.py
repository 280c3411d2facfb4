"""Review of the Gemma 3 text model on configs it was not written around, shaped like the released checkpoints'
config.json files (scaled down): gemma-3-1b (one KV head, head_dim > hidden / heads, query_pre_attn_scalar =
head_dim, 8 layers under a pattern of 6), gemma-3-27b (query_pre_attn_scalar = hidden / heads, linear RoPE factor 8
on global layers only, rope_local_base_freq 10000), a fine-tune with only final-logit soft-capping, its own
rms_norm_eps and a window of 3, and a gemma-3-4b-it Gemma3ForConditionalGeneration whose text_config is as sparse
as the hub's (heads, head_dim, query_pre_attn_scalar at transformers' defaults, left out) and whose weights carry
the hub's names (language_model.model.*). Each is written to config.json in hub form and read back by transformers
(the reference), so both sides read the same file. Greedy tokens over 16 steps on prompts shorter and longer than
the sliding window, and each decode step's top-20 logprobs, against transformers in float32; chunked prefill and
a prefix-cache hit under a window of 3; fields it cannot run (untied lm_head, bidirectional attention, dynamic
RoPE) refused by name."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import (Gemma3Config, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3TextConfig,
                          SiglipVisionConfig)

from atomlite import LLM, SamplingParams
from atomlite.errors import ConfigError
from helpers import greedy, hf_greedy, hf_logprobs, random_prompt
from tiny_models import randomize

VOCAB, STEPS, TOP = 96, 16, 20
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=512, bos_token_id=2, eos_token_id=1, pad_token_id=0)

# Each entry: the model's fields as a hub config.json spells them (legacy RoPE fields, sliding_window_pattern).
CONFIGS = {
    # gemma-3-1b: hidden 1152, 4 heads x 256, 1 KV head, qpas 256, 26 layers (not a multiple of 6), no scaling.
    "1b_like": dict(hidden_size=48, intermediate_size=80, num_hidden_layers=8, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=64, query_pre_attn_scalar=64, sliding_window=6,
                    sliding_window_pattern=6, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                    rope_scaling=None, attn_logit_softcapping=None, final_logit_softcapping=None,
                    eos_token_id=[1, 50]),
    # gemma-3-27b: hidden 5376, 32 heads x 128, 16 KV heads, qpas 168 = hidden / heads, linear factor 8 (global).
    "27b_like": dict(hidden_size=96, intermediate_size=128, num_hidden_layers=7, num_attention_heads=8,
                     num_key_value_heads=4, head_dim=16, query_pre_attn_scalar=12, sliding_window=10,
                     sliding_window_pattern=6, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                     rope_scaling={"rope_type": "linear", "factor": 8.0}),
    # A fine-tune: only the final soft-cap (tight enough to bend the logits), a large norm eps, a window of 3 and a
    # pattern of 4 over 10 layers (the last two sliding).
    "finetune": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=10, num_attention_heads=2,
                     num_key_value_heads=2, head_dim=40, query_pre_attn_scalar=30, sliding_window=3,
                     sliding_window_pattern=4, rope_theta=10_000.0, rope_local_base_freq=100.0,
                     final_logit_softcapping=2.0, rms_norm_eps=1e-2),
}
# gemma-3-4b-it's text_config: hidden, intermediate, layers, rope_scaling and sliding_window only.
HUB_4B_TEXT = dict(model_type="gemma3_text", hidden_size=64, intermediate_size=96, num_hidden_layers=7,
                   rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=5, vocab_size=VOCAB)
PROMPT_LENGTHS = (3, 9, 30)  # 30 is longer than every sliding window above


def _text_config(fields: dict) -> Gemma3TextConfig:
    return Gemma3TextConfig(**{**COMMON, **fields})


def _write_hub_text_config(out: Path, fields: dict) -> None:
    raw = json.loads((out / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        raw.pop(key)
    raw.update(fields)
    (out / "config.json").write_text(json.dumps(raw, indent=2))


def build_text(name: str, out: Path):
    fields = CONFIGS[name]
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(_text_config(fields))
    randomize(model, seed=1)
    model.save_pretrained(out)
    _write_hub_text_config(out, fields)
    ref = Gemma3ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert ref.config.layer_types == model.config.layer_types
    assert ref.config.rope_parameters == model.config.rope_parameters
    return ref


def build_conditional_generation(out: Path):
    """A gemma-3-4b-it shaped checkpoint: the hub's sparse text_config, its top-level eos list and its weight names
    (language_model.model.*, vision_tower.vision_model.*, multi_modal_projector.*, no lm_head)."""
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    text = {k: v for k, v in HUB_4B_TEXT.items() if k != "model_type"}
    config = Gemma3Config(text_config=Gemma3TextConfig(**text).to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=4, image_token_index=95, boi_token_index=93, eoi_token_index=94)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config)
    randomize(model, seed=2)
    model.save_pretrained(out)
    raw = json.loads((out / "config.json").read_text())
    raw["text_config"] = HUB_4B_TEXT
    raw["eos_token_id"] = [1, 50]
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    weights = {_hub_name(k): v.float() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for f in out.glob("*.safetensors"):
        f.unlink()
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, out / "model.safetensors", metadata={"format": "pt"})
    ref = Gemma3ForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    assert torch.equal(ref.model.language_model.layers[0].self_attn.q_proj.weight,
                       model.model.language_model.layers[0].self_attn.q_proj.weight), "reference misloaded"
    assert ref.config.text_config.head_dim == 256 and ref.config.text_config.num_attention_heads == 8
    return ref


def _hub_name(name: str) -> str:
    for new, old in (("model.language_model.", "language_model.model."),
                     ("model.vision_tower.", "vision_tower."), ("model.multi_modal_projector.",
                                                                 "multi_modal_projector.")):
        if name.startswith(new):
            return old + name[len(new):]
    return name


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            ref = build_conditional_generation(out) if name == "4b_it_multimodal" else build_text(name, out)
            cache[name] = out, ref
        return cache[name]
    return get


def assert_steps_match(ref, prompt: list[int], out) -> None:
    tokens = out.outputs[0].token_ids
    assert tokens == hf_greedy(ref, prompt, STEPS), len(prompt)
    expected = hf_logprobs(ref, prompt + tokens)[len(prompt) - 1:-1]
    for step, entry in enumerate(out.outputs[0].logprobs):
        ids = list(entry)
        mine = torch.tensor([float(entry[i]) for i in ids])
        err = (mine - expected[step, ids]).abs().max().item()
        assert err < 1e-4, (len(prompt), step, err)


@pytest.mark.parametrize("name", [*CONFIGS, "4b_it_multimodal"])
def test_greedy_steps_and_logprobs_match_transformers(built, name):
    path, ref = built(name)
    llm = LLM(str(path), dtype="float32", device="cpu")
    prompts = [random_prompt(n, seed=100 + n) for n in PROMPT_LENGTHS]
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=TOP)
    for prompt, out in zip(prompts, llm.generate(prompts, params)):
        assert_steps_match(ref, prompt, out)


def test_chunked_prefill_and_prefix_hit_under_a_window_of_three(built):
    """Chunks of 5 tokens and 4-token blocks over a window of 3: every chunk starts mid window, and a cached prefix
    ends mid window."""
    path, ref = built("finetune")
    llm = LLM(str(path), dtype="float32", device="cpu", max_num_batched_tokens=5, block_size=4)
    prefix = random_prompt(22, seed=7)
    llm.generate([prefix + random_prompt(2, seed=8)], greedy(3))
    prompt = prefix + random_prompt(7, seed=9)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=TOP)
    out = llm.generate([prompt], params)[0]
    assert out.num_cached_tokens >= 16
    assert_steps_match(ref, prompt, out)


REFUSED = {  # config.json fields transformers runs differently from a causal Gemma 3 with tied logits
    "tie_word_embeddings": False,  # no released Gemma 3 unties its lm_head
    "use_bidirectional_attention": True,  # EmbeddingGemma
    "rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
}


@pytest.mark.parametrize("field", REFUSED)
def test_fields_it_cannot_run_are_refused_by_name(tmp_path, field):
    torch.manual_seed(0)
    Gemma3ForCausalLM(_text_config(CONFIGS["finetune"])).save_pretrained(tmp_path)
    _write_hub_text_config(tmp_path, {**CONFIGS["finetune"], field: REFUSED[field]})
    with pytest.raises(ConfigError, match=field if field != "rope_scaling" else "dynamic"):
        LLM(str(tmp_path), dtype="float32", device="cpu")
