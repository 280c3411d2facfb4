"""Tensor parallelism on CPU: two processes over gloo, each holding its shards of a tiny checkpoint, give the
single-process model's greedy tokens and logprobs (float32, 1e-4) through prefill and decode steps of a paged KV
cache: dense, MoE, per-layer inputs with KV sharing, KV heads fewer than the ranks, MXFP4; Gemma 3 (linear RoPE
and soft-capping; one KV head, head_dim != hidden / heads)."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from atomlite import distributed
from atomlite.distributed.local import run_local
from atomlite.loader import DUMMY_E8M0_RANGE
from helpers import random_prompt
from quark_configs import quark_config
from tensor_parallel_run import build, greedy_logits, run_rank

STEPS = 4
PROMPT = random_prompt(11, seed=5)
MXFP4_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def mxfp4_copy(path: Path, out: Path) -> Path:
    """path's checkpoint with every projection replaced by random MXFP4 bytes and scales, and Quark's config."""
    shutil.copytree(path, out)
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name, tensor in load_file(out / "model.safetensors").items():
        if name.endswith(".weight") and name.split(".")[-2] in MXFP4_PROJECTIONS:
            rows, columns = tensor.shape
            tensors[name] = torch.randint(0, 256, (rows, columns // 2), generator=generator, dtype=torch.uint8)
            tensors[name + "_scale"] = torch.randint(*DUMMY_E8M0_RANGE, (rows, columns // 32), generator=generator,
                                                     dtype=torch.uint8)
        else:
            tensors[name] = tensor
    save_file(tensors, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = quark_config()["quantization_config"]
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def cases(checkpoints, tmp_path_factory) -> dict[str, Path]:
    wide = checkpoints.get("dense", intermediate_size=128)[0]  # 64 per rank: whole MXFP4 blocks
    return {"dense": checkpoints.get("dense")[0], "moe": checkpoints.get("moe")[0],
            "ple": checkpoints.get("ple")[0],
            "one_kv_head": checkpoints.get("dense", num_key_value_heads=1)[0],
            "mxfp4": mxfp4_copy(wide, tmp_path_factory.mktemp("tp") / "mxfp4"),
            "gemma3": checkpoints.gemma3("gemma3_linear_softcap")[0],
            "gemma3_one_kv_head": checkpoints.gemma3("gemma3_wide_heads")[0]}


@pytest.fixture(scope="module")
def two_ranks(cases, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("tp-run") / "rank0.pt"
    run_local(run_rank, 2, cases, PROMPT, STEPS, out)
    return torch.load(out)


@pytest.mark.parametrize("case", ["dense", "moe", "ple", "one_kv_head", "mxfp4", "gemma3", "gemma3_one_kv_head"])
def test_two_ranks_give_the_single_process_tokens_and_logprobs(cases, two_ranks, case):
    single = greedy_logits(build(cases[case], distributed.TensorParallel()), PROMPT, STEPS)
    sharded = two_ranks["logits"][case]
    assert sharded.argmax(-1).tolist() == single.argmax(-1).tolist()
    torch.testing.assert_close(torch.log_softmax(sharded, -1), torch.log_softmax(single, -1), rtol=0, atol=1e-4)


def test_each_rank_declares_its_kv_heads(two_ranks):
    """Dense: sliding layers' 2 KV heads split one per rank; the global layers' single KV head is replicated."""
    for rank_heads in two_ranks["kv_heads"]:
        assert rank_heads["dense"] == [1] * 6
        assert rank_heads["one_kv_head"] == [1] * 6
        assert rank_heads["gemma3"] == [1] * 7  # 2 KV heads, one a rank
        assert rank_heads["gemma3_one_kv_head"] == [1] * 5  # replicated
