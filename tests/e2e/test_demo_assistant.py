"""The bundled demo assistant drafts for the demo model: on the demo's own prompts (held-out gsm8k and MMLU style,
the README's question as a completion and as a chat) at k = 4, greedy output is the output without drafts, and the
mean accepted length (1 + accepted drafts per verifying step) is reported and at least 4.5: 4.67 measured (356 of
388 drafts accepted), as docs/SPECULATIVE.md says, with room for a retrained assistant's small changes."""
from atomlite import LLM, SamplingParams
from atomlite.demo import DEMO_ASSISTANT_DIR, DEMO_DIR
from atomlite.demo.tokenizer import build_char_tokenizer
from tools.demo_training.train import char_ids
from tools.demo_training.train_assistant import held_out_prompts


def test_demo_assistant_is_accepted_on_the_demo_prompts():
    prompts = [p for task in held_out_prompts(char_ids(build_char_tokenizer()), 3).values() for p in task]
    params = SamplingParams(temperature=0, max_tokens=48)
    want = [o.outputs[0].token_ids for o in LLM(str(DEMO_DIR), device="cpu").generate(prompts, params)]
    spec = {"method": "mtp", "model": str(DEMO_ASSISTANT_DIR), "num_speculative_tokens": 4}
    llm = LLM(str(DEMO_DIR), device="cpu", speculative_config=spec)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    stats = llm.engine.spec_stats
    print(f"demo assistant, k=4: mean accepted length {stats.mean_acceptance_length:.2f} over {stats.num_drafts} "
          f"verifying steps, {stats.num_accepted_tokens}/{stats.num_draft_tokens} drafts accepted")
    assert got == want
    assert stats.mean_acceptance_length >= 4.5
