"""The demo assistant's training recipe (tools/demo_training/train_assistant.py): its batched draft rounds are what
transformers' Gemma4AssistantForCausalLM computes one round at a time, and a short CPU run learns and saves a
drafter that transformers loads and drives."""
import json
import time

import pytest
import torch
from safetensors import safe_open
from transformers import Gemma4AssistantForCausalLM

from atomlite.demo import DEMO_DIR
from atomlite.demo.tokenizer import build_char_tokenizer
from tools.demo_training.train import char_ids, training_batch
from tools.demo_training.train_assistant import (DRAFTS, MAX_ASSISTANT_BYTES, build_assistant, draft_logits,
                                                 held_out_prompts, load_target, mean_accepted_length, parse_args,
                                                 round_lengths, target_pass, train)


@pytest.fixture(scope="module")
def target():
    return load_target(DEMO_DIR, "cpu")


def reference_round(assistant, embed, seen, ids, p: int, teacher_forced: bool) -> list[torch.Tensor]:
    """transformers' own forward for the round starting at p, step by step as its MTP candidate generator drives it:
    the target's K/V before p (the sliding kind cut to the window), h_{p-1}, then the assistant's own state."""
    shared_kv = {kind: (k[:, :, :p], v[:, :, :p]) for kind, (k, v) in seen.shared_kv.items()}
    shared_kv["sliding_attention"] = tuple(t[:, :, max(0, p - seen.window + 1):]
                                           for t in shared_kv["sliding_attention"])
    token, state, steps = ids[:, p:p + 1], seen.hidden[:, p - 1:p], []
    for j in range(1, DRAFTS + 1):
        out = assistant(inputs_embeds=torch.cat([embed(token), state], -1), position_ids=torch.tensor([[p]]),
                        attention_mask=torch.ones(ids.shape[0], p, dtype=torch.long), shared_kv_states=shared_kv)
        steps.append(out.logits[:, 0])
        state = out.last_hidden_state
        token = ids[:, p + j:p + j + 1] if teacher_forced else out.logits.argmax(-1)
    return steps


def test_target_pass_is_what_transformers_hands_the_assistant(target):
    ids, _ = training_batch(char_ids(build_char_tokenizer()), seed=0, step=1, batch_size=2, seq_len=64)
    seen = target_pass(target, ids)
    with torch.no_grad():
        out = target(input_ids=ids, return_shared_kv_states=True, output_hidden_states=True)
    torch.testing.assert_close(seen.hidden, out.hidden_states[-1])
    assert torch.equal(seen.greedy, out.logits.argmax(-1))
    assert seen.shared_kv.keys() == out.shared_kv_states.keys()
    for kind, (k, v) in out.shared_kv_states.items():
        assert torch.equal(seen.shared_kv[kind][0], k) and torch.equal(seen.shared_kv[kind][1], v)
    assert seen.window == target.config.sliding_window == 128


@pytest.mark.parametrize("teacher_forced", [True, False], ids=["teacher-forced", "own-drafts"])
def test_batched_draft_rounds_match_transformers_one_round_at_a_time(target, teacher_forced):
    torch.manual_seed(0)
    assistant = build_assistant(target, "cpu").eval()
    embed = target.get_input_embeddings()
    ids, _ = training_batch(char_ids(build_char_tokenizer()), seed=0, step=0, batch_size=2, seq_len=170)
    seen = target_pass(target, ids)
    with torch.no_grad():
        batched = draft_logits(assistant, embed, seen, ids, DRAFTS, teacher_forced)
        # inside the window, at its edge, and past it (sliding layers then see only its last W-1 keys)
        for p in [1, 2, 40, 126, 127, 128, 129, 166]:
            for j, expected in enumerate(reference_round(assistant, embed, seen, ids, p, teacher_forced), 1):
                torch.testing.assert_close(batched[j - 1][:, p - 1], expected, atol=2e-5, rtol=1e-4,
                                           msg=f"round at {p}, draft step {j}")


def test_round_lengths_follow_greedy_verification():
    # the first round starts at 10; one starting at p accepts accepted[p - 1] drafts and yields one token more, so
    # the next starts there; 9 marks starts no round reaches
    accepted = [9] * 9 + [4, 9, 9, 9, 9, 2, 9, 9, 1, 9, 0, 3, 9, 9, 9]
    assert round_lengths(accepted, first=10, end=25) == [5, 3, 2, 1, 4]
    # the round at 21 drafts positions 22..25: checking the last takes the target's choice at 24, past the end
    assert round_lengths(accepted, first=10, end=24) == [5, 3, 2, 1]
    assert round_lengths(accepted, first=10, end=13) == []


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """(loss of each step, saved folder) of a 30-step CPU run."""
    out = tmp_path_factory.mktemp("assistant")
    args = parse_args(["--device", "cpu", "--steps", "30", "--batch-size", "2", "--seq-len", "96", "--lr", "3e-3",
                       "--no-compile", "--eval-prompts", "0", "--eval-tokens", "8", "--out", str(out)])
    return train(args, time.monotonic()), out


def test_short_cpu_run_learns_and_saves_a_drafter_transformers_uses(target, short_run):
    losses, out = short_run
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0, losses

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Gemma4AssistantForCausalLM"] and config["model_type"] == "gemma4_assistant"
    weights = out / "model.safetensors"
    assert weights.stat().st_size <= MAX_ASSISTANT_BYTES
    with safe_open(weights, "pt") as f:
        assert {f.get_tensor(name).dtype for name in f.keys()} == {torch.bfloat16}

    assistant = Gemma4AssistantForCausalLM.from_pretrained(out).float().eval()
    assert assistant.generation_config.num_assistant_tokens == DRAFTS
    prompt = torch.tensor([build_char_tokenizer().encode("Question: 3 + 4?\nAnswer:", add_special_tokens=False)])
    alone = target.generate(prompt, max_new_tokens=12, do_sample=False)
    assisted = target.generate(prompt, assistant_model=assistant, max_new_tokens=12, do_sample=False)
    assert torch.equal(assisted, alone)


@torch.no_grad()
def speculative_decoding_rounds(target, assistant, prompt: list[int], new_tokens: int) -> list[int]:
    """Tokens per round of a plain greedy speculative decoding loop: transformers' assistant drafts round by round,
    the target (a full forward, no cache) verifies; only rounds whose drafts all fall within new_tokens count."""
    seq = prompt + [int(target(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())]
    lengths = []
    while len(seq) - 1 + DRAFTS <= len(prompt) + new_tokens:
        p, ids = len(seq) - 1, torch.tensor([seq])
        steps = reference_round(assistant, target.get_input_embeddings(), target_pass(target, ids), ids, p,
                                teacher_forced=False)
        drafts = [int(logits.argmax(-1)) for logits in steps]
        greedy = target(input_ids=torch.tensor([seq + drafts])).logits[0, p:].argmax(-1).tolist()
        accepted = next((j for j in range(DRAFTS) if drafts[j] != greedy[j]), DRAFTS)
        seq += drafts[:accepted] + [greedy[accepted]]
        lengths.append(accepted + 1)
    return lengths


def test_mean_accepted_length_is_that_of_a_speculative_decoding_loop(target, short_run):
    """The held-out measure the script prints, against rounds actually run (prompts inside and past the window)."""
    assistant = Gemma4AssistantForCausalLM.from_pretrained(short_run[1]).float().eval()
    prompts = held_out_prompts(char_ids(build_char_tokenizer()), per_task=1)
    measured = mean_accepted_length(assistant, target, prompts, new_tokens=16, device="cpu")
    rounds = {task: speculative_decoding_rounds(target, assistant, task_prompts[0], 16)
              for task, task_prompts in prompts.items()}
    rounds["all"] = [n for task_rounds in list(rounds.values()) for n in task_rounds]
    assert measured == {task: sum(n) / len(n) for task, n in rounds.items()}
    assert measured["all"] > 1.0  # some drafts accepted: the comparison is not one of rejections only
