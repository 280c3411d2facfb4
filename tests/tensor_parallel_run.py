"""Runs a tiny checkpoint's model in one process of a tensor-parallel group (or alone): a prompt's prefill, then
greedy decode steps through a paged KV cache, as the engine's ModelRunner drives it. Rank 0 saves what it saw."""
from pathlib import Path

import torch

from atomlite import SamplingParams, distributed
from atomlite.config import load_model_spec
from atomlite.engine.kv.kv_cache import KVCacheManager, group_specs
from atomlite.engine.runner.model_runner import ModelRunner
from atomlite.engine.sequence import Sequence
from atomlite.loader import load_weights
from atomlite.model_ops import dispatch
from atomlite.model_ops.fusion import link
from atomlite.model_ops.platform import Platform
from atomlite.models.construction import default_dtype
from atomlite.registry import model_class

BLOCK_SIZE, NUM_BLOCKS = 4, 64


def build(path: Path, tp: distributed.TensorParallel):
    spec = load_model_spec(path)
    with dispatch.use(Platform(), "torch"), distributed.use(tp), default_dtype(torch.float32):
        model = link(model_class(spec.architecture)(spec, max_positions=256))
    load_weights(model, path)
    return model.eval()


def greedy_logits(model, prompt: list[int], steps: int) -> torch.Tensor:
    """[steps, vocab] fp32 logits: of the prompt's last token, then of each greedy token fed back."""
    specs = model.kv_specs(torch.float32)
    kv = KVCacheManager(specs, NUM_BLOCKS * len(group_specs(specs)[0]), BLOCK_SIZE, torch.device("cpu"), False)
    runner, seq, rows = ModelRunner(model, kv, torch.device("cpu")), Sequence(prompt, SamplingParams()), []
    for _ in range(steps):
        num_new = seq.num_uncomputed
        assert kv.allocate(seq, num_new)
        logits, _ = runner.execute([(seq, num_new)])
        seq.num_computed_tokens += num_new
        kv.release_out_of_window(seq)
        rows.append(logits[-1])
        seq.token_ids.append(int(logits[-1].argmax()))
    return torch.stack(rows)


def run_rank(tp: distributed.TensorParallel, cases: dict[str, Path], prompt: list[int], steps: int,
             out: Path) -> None:
    """Every case's logits in this rank; rank 0 saves them to out (case -> [steps, vocab]) and the KV heads each
    rank's model declared (case -> per rank, per layer)."""
    logits, kv_heads = {}, {}
    for case, path in cases.items():
        model = build(path, tp)
        logits[case] = greedy_logits(model, prompt, steps)
        kv_heads[case] = [spec.num_kv_heads for spec in model.kv_specs(torch.float32)]
    gathered = [None] * tp.size
    torch.distributed.all_gather_object(gathered, kv_heads)
    if tp.rank == 0:
        torch.save({"logits": logits, "kv_heads": gathered}, out)
