"""The Gemma 4 assistant (MTP drafter) against transformers' own, float32 on tiny random models: drafting over
atomlite's paged KV cache of the target, it gives the logits of transformers' assistant fed the target's
shared_kv_states, step after step (each step's guess and projected hidden state fed back at the same position)."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import tiny_models
from atomlite import LLM, SamplingParams
from atomlite.config import load_model_spec
from atomlite.engine.kv.block_pool import NULL_BLOCK
from atomlite.engine.sequence import Sequence
from atomlite.engine.runner.step_inputs import StepInputBuilder
from atomlite.errors import ConfigError
from atomlite.model_ops import dispatch
from atomlite.model_ops.context import ForwardContext, GroupBatch, HostBatch
from atomlite.model_ops.platform import Platform
from atomlite.models.gemma4 import Gemma4ForCausalLM
from atomlite.models.gemma4_assistant import build_assistant, load_assistant_spec
from helpers import random_prompt

WINDOW = tiny_models.BASE["sliding_window"]
STEPS = 3
DEMO = Path(__file__).parents[2] / "atomlite" / "demo" / "model"


def target_llm(path: Path) -> LLM:
    return LLM(str(path), dtype="float32", device="cpu", block_size=4, enable_prefix_caching=False)


def assistant_for(llm: LLM, path: Path, load_format: str = "auto", kernel_backend: str = "auto"):
    """The assistant, with kernels of kernel_backend, its attention bound to the target's caches as the engine
    binds them."""
    with dispatch.use(Platform(), kernel_backend):
        assistant = build_assistant(load_assistant_spec(path), llm.engine.model, "cpu", torch.float32, load_format)
    for attention, layer in zip(assistant.attention_layers(), assistant.target_kv_layers):
        attention.bind_cache(*llm.engine.kv.cache_for_layer(layer))
    return assistant


@torch.inference_mode()
def prefill(llm: LLM, prompts: list[list[int]]) -> tuple[list[Sequence], torch.Tensor]:
    """Each prompt's K/V into the target's cache (sliding blocks out of the window released, as after a step) ->
    the sequences and the target's final hidden state at each prompt's last position. One step per prompt, as
    transformers reads them: a batched GEMM rounds differently, which three draft steps amplify to ~1e-4."""
    kv, seqs, last_hidden = llm.engine.kv, [], []
    builder = StepInputBuilder(kv, torch.device("cpu"), {})
    for prompt in prompts:
        seq = Sequence(prompt, SamplingParams())
        assert kv.allocate(seq, len(prompt))
        ids, ctx = builder.context(builder.build([(seq, len(prompt))]))
        last_hidden.append(llm.engine.model(ids, ctx)[-1])
        seq.num_computed_tokens = len(prompt)
        kv.release_out_of_window(seq)
        seqs.append(seq)
    return seqs, torch.stack(last_hidden)


def drafter_context(kv, seqs: list[Sequence]) -> ForwardContext:
    """One query per sequence at position p = its length, seeing the target's keys 0..p-1, writing none."""
    positions = [len(seq.token_ids) for seq in seqs]
    groups = {}
    for group in kv.groups:
        rows = [seq.block_tables[group.id].array() for seq in seqs]
        table = np.full((len(rows), max(map(len, rows))), NULL_BLOCK, dtype=np.int32)
        for b, row in enumerate(rows):
            table[b, :len(row)] = row
        groups[group.id] = GroupBatch(torch.full((len(seqs),), -1, dtype=torch.int64), torch.from_numpy(table))
    starts = list(range(len(seqs) + 1))
    return ForwardContext(torch.tensor(positions), torch.tensor(starts, dtype=torch.int32),
                          torch.tensor(positions, dtype=torch.int32), groups, HostBatch.of(starts, positions))


@torch.inference_mode()
def atomlite_drafts(assistant, ids: list[int], hidden: torch.Tensor, ctx: ForwardContext) -> list[torch.Tensor]:
    """[B, vocab] logits of each draft step, each step fed the previous one's greedy guess."""
    ids, logits = torch.tensor(ids), []
    for _ in range(STEPS):
        normed, hidden = assistant(ids, hidden, ctx)
        logits.append(assistant.compute_logits(normed))
        ids = logits[-1].argmax(dim=-1)
    return logits


@torch.no_grad()
def transformers_drafts(target, assistant, prompt: list[int], tokens: list[int],
                        sliding_keys: slice = slice(None)) -> list[torch.Tensor]:
    """transformers' assistant as its candidate generator drives it, after the target read prompt (p tokens): each
    step fed tokens[i] at position p. sliding_keys: the part of the sliding layers' K/V it is given."""
    out = target(torch.tensor([prompt]), return_shared_kv_states=True, output_hidden_states=True, use_cache=False)
    shared = dict(out.shared_kv_states)
    shared["sliding_attention"] = tuple(t[:, :, sliding_keys] for t in shared["sliding_attention"])
    hidden, position = out.hidden_states[-1][:, -1:], torch.tensor([[len(prompt)]])
    logits = []
    for token in tokens:
        embeds = torch.cat([target.get_input_embeddings()(torch.tensor([[token]])), hidden], dim=-1)
        step = assistant(inputs_embeds=embeds, position_ids=position, shared_kv_states=shared)
        logits.append(step.logits[0, 0])
        hidden = step.last_hidden_state
    return logits


def assert_drafts_match(mine: list[torch.Tensor], b: int, expected: list[torch.Tensor]) -> None:
    for step, (got, want) in enumerate(zip(mine, expected)):
        assert torch.allclose(got[b], want, atol=1e-4, rtol=0), (b, step, (got[b] - want).abs().max())


# target -> (tiny_models variant, overrides, the assistants drafting for it: with ordered embeddings or not)
TARGETS = {"k_eq_v": ("dense", {}, (False, True)), "k_and_v": ("dense", {"attention_k_eq_v": False}, (False, True)),
           "kv_shared": ("ple", {}, (False,))}


@pytest.mark.parametrize("target_name", list(TARGETS))
def test_drafts_match_transformers_assistant(checkpoints, tmp_path, target_name):
    variant, overrides, orderings = TARGETS[target_name]
    target_path, target_ref = checkpoints.get(variant, **overrides)
    llm = target_llm(target_path)
    full = [random_prompt(7, seed=1), random_prompt(4, seed=2)]  # contexts of 6 and 3 keys: inside the window
    seqs, hidden = prefill(llm, [prompt[:-1] for prompt in full])
    ctx = drafter_context(llm.engine.kv, seqs)
    for ordered in orderings:
        path = tmp_path / f"ordered-{ordered}"
        assistant_ref = tiny_models.build_assistant(variant, path, ordered=ordered, **overrides)
        assistant = assistant_for(llm, path)
        derives_k = [attention.key_rope is not None for attention in assistant.attention_layers()]
        assert derives_k == [False, False, target_name == "k_eq_v"]  # the k_eq_v target's full layer stores V only
        if target_name == "kv_shared":  # its last layers share KV: the assistant reads their owners' caches
            assert assistant.target_kv_layers == [4, 4, 2]
        mine = atomlite_drafts(assistant, [prompt[-1] for prompt in full], hidden, ctx)
        for b, prompt in enumerate(full):
            tokens = [prompt[-1]] + [int(step[b].argmax()) for step in mine[:-1]]
            assert_drafts_match(mine, b, transformers_drafts(target_ref, assistant_ref, prompt[:-1], tokens))


@pytest.mark.parametrize("kernel_backend", ["torch", "triton"])
def test_drafts_past_the_window_read_only_the_blocks_the_target_keeps(checkpoints, tmp_path, kernel_backend):
    """At p = 23 (window 8, blocks of 4) the target has released positions 0..15 of its sliding layers; the drafter
    sees keys 16..22 there (window - 1 keys before its query), and every key of the full layers. The target
    prefills with the reference either way: under the Triton interpreter that alone would take ~15 s."""
    if kernel_backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels run on CPU tensors only under the interpreter (set where no GPU is)")
    target_path, target_ref = checkpoints.get("dense")
    assistant_ref = tiny_models.build_assistant("dense", tmp_path)
    llm = target_llm(target_path)
    assistant = assistant_for(llm, tmp_path, kernel_backend=kernel_backend)
    assert {attention.attend_kernel.backend for attention in assistant.attention_layers()} == {kernel_backend}
    full = [random_prompt(24, seed=3), random_prompt(6, seed=4)]
    seqs, hidden = prefill(llm, [prompt[:-1] for prompt in full])
    kv = llm.engine.kv
    for group in kv.groups:
        if group.spec.kind == "sliding":
            assert seqs[0].block_tables[group.id].array()[:4].tolist() == [NULL_BLOCK] * 4
            for layer in group.layers:
                for cache in kv.caches[layer]:
                    if cache is not None:
                        cache[NULL_BLOCK] = float("nan")
    mine = atomlite_drafts(assistant, [prompt[-1] for prompt in full], hidden, drafter_context(kv, seqs))
    assert all(torch.isfinite(step).all() for step in mine)
    for b, prompt in enumerate(full):
        p = len(prompt) - 1
        tokens = [prompt[-1]] + [int(step[b].argmax()) for step in mine[:-1]]
        visible = slice(max(0, p - WINDOW + 1), p)
        assert_drafts_match(mine, b, transformers_drafts(target_ref, assistant_ref, prompt[:-1], tokens, visible))


def test_dummy_assistant_drafts_for_the_demo_model(tmp_path):
    """--load-format dummy at the demo model's shapes (its global layers store V only): drafts come out finite."""
    tiny_models.assistant_config("dense", ordered=True, vocab_size=128, hidden_size=256,
                                 sliding_window=128).save_pretrained(tmp_path)
    llm = LLM(str(DEMO), dtype="float32", device="cpu")
    assistant = assistant_for(llm, tmp_path, load_format="dummy")
    assert assistant.target_kv_layers == [4, 4, 5]
    assert assistant.attention_layers()[2].key_rope is not None
    seqs, hidden = prefill(llm, [list(range(3, 20))])
    logits = atomlite_drafts(assistant, [7], hidden, drafter_context(llm.engine.kv, seqs))
    assert all(step.shape == (1, 128) and torch.isfinite(step).all() for step in logits)


def save_target_config(path: Path, **overrides) -> Gemma4ForCausalLM:
    """A target built from config.json alone (weights left unset: the checks read shapes only)."""
    config = tiny_models.text_config("dense", **overrides)
    config.architectures = ["Gemma4ForCausalLM"]
    config.save_pretrained(path)
    return Gemma4ForCausalLM(load_model_spec(path), max_positions=64)


@pytest.mark.parametrize("target_overrides,assistant_overrides,message", [
    ({}, {"backbone_hidden_size": 48}, "hidden size 48"),
    ({}, {"vocab_size": 128}, "vocab_size 128"),
    ({"layer_types": ["full_attention"] * 6}, {}, "sliding attention layers"),
])
def test_build_assistant_rejects_a_target_it_was_not_made_for(tmp_path, target_overrides, assistant_overrides,
                                                              message):
    target = save_target_config(tmp_path / "target", **target_overrides)
    config = tiny_models.assistant_config("dense")
    if "vocab_size" in assistant_overrides:
        config.text_config.vocab_size = assistant_overrides.pop("vocab_size")
    for name, value in assistant_overrides.items():
        setattr(config, name, value)
    config.save_pretrained(tmp_path / "assistant")
    with pytest.raises(ConfigError, match=message):
        build_assistant(load_assistant_spec(tmp_path / "assistant"), target, "cpu", torch.float32, "dummy")


def test_load_assistant_spec_rejects_what_is_not_an_assistant(tmp_path):
    save_target_config(tmp_path / "target")
    with pytest.raises(ConfigError, match="model_type 'gemma4_text'.*gemma4_assistant"):
        load_assistant_spec(tmp_path / "target")
    with pytest.raises(ConfigError, match="does not exist"):
        load_assistant_spec(tmp_path / "nowhere")
    tiny_models.assistant_config("dense").save_pretrained(tmp_path / "partial")
    raw = json.loads((tmp_path / "partial" / "config.json").read_text())
    raw["text_config"]["num_kv_shared_layers"] = 1
    (tmp_path / "partial" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="every assistant layer must read the target's KV"):
        load_assistant_spec(tmp_path / "partial")
