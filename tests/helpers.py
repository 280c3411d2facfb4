import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

from atomlite import LLM, SamplingParams
from atomlite.quant import fp8


def random_prompt(length: int, seed: int, vocab: int = 96) -> list[int]:
    return torch.randint(3, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] log-probs of the next token at each position, from transformers."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def hf_greedy(model, ids: list[int], max_tokens: int) -> list[int]:
    """transformers' generate(), greedy, never stopping early (like ignore_eos=True)."""
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False)
    return out[0, len(ids):].tolist()


def atomlite_prompt_logprobs(llm: LLM, ids: list[int], vocab: int) -> torch.Tensor:
    """[len(ids) - 1, vocab]: row i is the distribution atomlite gives for token i + 1."""
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=vocab))[0]
    rows = []
    for entry in out.prompt_logprobs[1:]:
        row = torch.full((vocab,), float("nan"))
        for token, logprob in entry.items():
            row[token] = logprob
        rows.append(row)
    return torch.stack(rows)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def assert_same_rounded_sum(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal on a GPU; the interpreter's bf16 conversion truncates where torch's rounds: one ulp apart at most."""
    if got.is_cuda:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=0)


def admit_optimistically(llm):
    """Admission that expects every request to stop at its first token, so that sequences outgrow a small KV cache
    and are preempted: what the preemption tests exercise (admission otherwise keeps room for them to grow)."""
    share = llm.engine.scheduler.output_share
    for _ in range(share.recent.maxlen):
        share.record(0.0)
    return llm


def assert_gemm_close(got, x, q, scale, spec, input_scale, out_dtype=torch.float32):
    """got against the reference within the summation's rounding: each element off by at most a fraction of the sum
    of its products' magnitudes (fp32 sums in the interpreter: 1e-5; a GPU's fp8 MMAs accumulate with about 14 bits
    of mantissa, as Hopper's do: 2^-9), plus the output's rounding. A wrong scale on one block of K, or a tile
    left out, moves an element by a whole block's share of that sum."""
    x, q, scale = x.float().cpu(), q.cpu(), scale.cpu()
    input_scale = None if input_scale is None else input_scale.cpu()
    want = fp8.gemm(x, q, scale, spec, input_scale)
    magnitude = fp8.quantize_dequantize_input(x, spec, input_scale).abs() @ fp8.dequantize_weight(
        q, scale, spec.block[1]).abs().T
    sums = 1e-5 if got.device.type == "cpu" else 2 ** -9
    rounding = 0.0 if out_dtype == torch.float32 else torch.finfo(out_dtype).eps
    bound = sums * magnitude + rounding * want.abs() + 1e-30
    excess = ((got.float().cpu() - want).abs() / bound).max().item()
    assert excess <= 1.0, f"off by {excess:.2f}x the rounding bound"
