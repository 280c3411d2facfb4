"""Tensor parallelism through the engine on CPU: LLM(tensor_parallel_size=2) starts its second rank itself (gloo), and
gives the single-process engine's greedy tokens and logprobs (float32, 1e-4) for batched prompts through chunked
prefill and decode: dense, MoE, per-layer inputs with KV sharing, KV heads fewer than the ranks, MXFP4, Gemma 3;
and with n-gram speculative decoding (verify steps). `atomlite serve --tensor-parallel-size 2` answers the OpenAI client
and stops every rank on SIGTERM; a rank that dies takes the others down with it, none is left waiting."""
import signal
import subprocess
import sys
import time

import psutil
import pytest

from atomlite import LLM, SamplingParams
from atomlite.accuracy.runner import SERVED_NAME, start_server
from atomlite.errors import ConfigError
from helpers import random_prompt
from test_tensor_parallel import mxfp4_copy

PROMPTS = [random_prompt(n, seed=n) for n in (5, 23, 11)]
ENGINE_ARGS = dict(device="cpu", dtype="float32", max_model_len=128, max_num_batched_tokens=16)
PARAMS = SamplingParams(max_tokens=6, temperature=0, logprobs=3, ignore_eos=True)


@pytest.fixture(scope="module")
def cases(checkpoints, tmp_path_factory) -> dict:
    wide = checkpoints.get("dense", intermediate_size=128)[0]  # 64 per rank: whole MXFP4 blocks
    return {"dense": checkpoints.get("dense")[0], "moe": checkpoints.get("moe")[0],
            "ple": checkpoints.get("ple")[0],
            "one_kv_head": checkpoints.get("dense", num_key_value_heads=1)[0],
            "mxfp4": mxfp4_copy(wide, tmp_path_factory.mktemp("tp-engine") / "mxfp4"),
            "gemma3": checkpoints.gemma3("gemma3_linear_softcap")[0]}


def generate(path, params=PARAMS, **args) -> list:
    llm = LLM(str(path), **{**ENGINE_ARGS, **args})
    try:
        return [out.outputs[0] for out in llm.generate(PROMPTS, params)]
    finally:
        llm.engine.close()


def assert_same(sharded: list, single: list) -> None:
    for got, want in zip(sharded, single, strict=True):
        assert got.token_ids == want.token_ids
        for got_step, want_step in zip(got.logprobs, want.logprobs, strict=True):
            assert got_step.keys() == want_step.keys()
            for token, logprob in want_step.items():
                assert abs(got_step[token] - logprob) <= 1e-4


@pytest.mark.parametrize("case", ["dense", "moe", "ple", "one_kv_head", "mxfp4", "gemma3"])
def test_two_ranks_give_the_single_engine_tokens_and_logprobs(cases, case):
    assert_same(generate(cases[case], tensor_parallel_size=2), generate(cases[case]))


def test_prefix_cache_hits_are_rank_0s_and_read_the_same_blocks_on_both_ranks(cases):
    """Rank 0 alone keeps the prefix cache; the block tables it sends make the other rank read its own copies."""
    llm = LLM(str(cases["dense"]), **ENGINE_ARGS, tensor_parallel_size=2)
    try:
        first = llm.generate(PROMPTS, PARAMS)
        again = llm.generate(PROMPTS, PARAMS)
    finally:
        llm.engine.close()
    assert again[1].num_cached_tokens == 16  # the one prompt of a full block (23 tokens)
    assert_same([out.outputs[0] for out in again], [out.outputs[0] for out in first])


def test_verify_steps_of_ngram_drafts_run_on_both_ranks(cases):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    assert_same(generate(cases["dense"], tensor_parallel_size=2, speculative_config=spec),
                generate(cases["dense"]))


def test_close_stops_the_other_ranks_before_rank_0_leaves_the_group(cases, monkeypatch):
    """Rank 0's process holds the group's TCPStore: a worker still in the group when it goes prints c10d
    tracebacks (nccl polls the store), so every worker has exited when rank 0 leaves."""
    from atomlite.engine.runner import workers as workers_module
    llm = LLM(str(cases["dense"]), **ENGINE_ARGS, tensor_parallel_size=2)
    workers = [psutil.Process(pid) for pid in llm.engine.workers.pids]
    assert "tensor parallel: 2 ranks (gloo)" in "\n".join(llm.engine.describe())
    alive_at_leave = []
    leave = workers_module.leave_group
    monkeypatch.setattr(workers_module, "leave_group",
                        lambda: (alive_at_leave.append([_alive(w) for w in workers]), leave()))
    llm.engine.close()
    assert alive_at_leave == [[False]]
    assert not any(_alive(w) for w in workers)


BENCH_FLAGS = ["--input-len", "12", "--output-len", "3", "--batch-size", "2", "--repeats", "1",
               "--max-model-len", "128", "--tensor-parallel-size", "2"]
C10D_NOISE = ("Traceback", "recvValue", "TCPStore", "Connection was likely closed", "terminate called",
              "did not shut down")


def assert_quiet(stderr: str) -> None:
    noise = [line for line in stderr.splitlines() if any(word in line for word in C10D_NOISE)]
    assert not noise, stderr


def _bench_latency_stderr(path, *flags) -> str:
    run = subprocess.run([sys.executable, "-m", "atomlite.cli", "bench", "latency", "--model", str(path),
                          "--load-format", "dummy", *BENCH_FLAGS, *flags],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "TPOT, batch 2" in run.stdout
    return run.stderr


def test_a_two_rank_bench_that_ends_normally_prints_no_traceback(cases):
    """The engine is closed by its finalizer at interpreter exit here: the workers still leave first."""
    assert_quiet(_bench_latency_stderr(cases["moe"], "--device", "cpu", "--dtype", "float32"))


@pytest.mark.gpu
def test_a_bench_on_two_gpus_that_ends_normally_prints_no_traceback(cases):
    """nccl: the workers' monitor threads poll rank 0's TCPStore until they leave the group."""
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    assert_quiet(_bench_latency_stderr(cases["moe"], "--device", "cuda", "--dtype", "bfloat16"))


def test_a_size_the_heads_cannot_be_split_by_fails_before_any_rank_starts(cases):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ConfigError, match="num_attention_heads = 4 is not divisible by the tensor-parallel size 3"):
        LLM(str(cases["dense"]), **ENGINE_ARGS, tensor_parallel_size=3)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_an_error_every_rank_meets_while_starting_reaches_the_caller(cases):
    """The worker meets it too and exits first or not: rank 0 raises it rather than exiting for the dead worker."""
    with pytest.raises(ConfigError, match="kv"):
        LLM(str(cases["dense"]), **ENGINE_ARGS, tensor_parallel_size=2, kv_cache_memory=1024)


def test_mtp_under_tensor_parallelism_is_refused(cases):
    with pytest.raises(ConfigError, match="does not run under tensor parallelism"):
        LLM(str(cases["dense"]), **ENGINE_ARGS, tensor_parallel_size=2,
            speculative_config={"method": "mtp", "model": str(cases["dense"]), "num_speculative_tokens": 2})


def test_serve_with_two_ranks_answers_and_stops_every_rank_on_sigterm(random_model_dir, tmp_path):
    proc, base = start_server(random_model_dir, ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
                                                 "--tensor-parallel-size", "2"], tmp_path / "server.log")
    from openai import OpenAI  # here: the GPU machine's image lacks it, and runs only the gpu tests of this file
    try:
        ranks = psutil.Process(proc.pid).children(recursive=True)
        client = OpenAI(base_url=f"{base}/v1", api_key="none")
        chat = client.chat.completions.create(model=SERVED_NAME, max_tokens=8,
                                              messages=[{"role": "user", "content": "Hello"}])
        assert chat.choices[0].message.content is not None
        stream = client.completions.create(model=SERVED_NAME, prompt="The sky is", max_tokens=8, stream=True)
        assert sum(1 for _ in stream) >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        log = (tmp_path / "server.log").read_text()
        assert not [p.pid for p in ranks if _alive(p)], log
        assert_quiet(log)
    finally:
        proc.kill()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["dense", "moe", "gemma3"])
def test_two_gpus_replaying_graphs_give_the_single_gpu_tokens(cases, case):
    """nccl, decode graphs that capture the all-reduces, and overlapped decode (rank 0 broadcasts the ids it sampled
    on its GPU to the step launched ahead)."""
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    gpu = dict(device="cuda", kv_cache_memory=256 * 2**20, max_num_batched_tokens=16)
    sharded = generate(cases[case], tensor_parallel_size=2, **gpu)
    single = generate(cases[case], **gpu)
    assert [s.token_ids for s in sharded] == [s.token_ids for s in single]
    for got, want in zip(sharded, single):
        for got_step, want_step in zip(got.logprobs, want.logprobs):
            token = max(want_step, key=want_step.get)
            assert abs(got_step[token] - want_step[token]) <= 1e-3


RANKS_SCRIPT = """
import sys
from atomlite import LLM, SamplingParams
llm = LLM(sys.argv[1], device="cpu", dtype="float32", max_model_len=128, tensor_parallel_size=2)
print(llm.engine.workers.pids[0], flush=True)
while True:
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=20, ignore_eos=True))
"""


def _start_ranks(path) -> tuple[subprocess.Popen, psutil.Process]:
    proc = subprocess.Popen([sys.executable, "-c", RANKS_SCRIPT, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, psutil.Process(int(proc.stdout.readline()))


def test_a_worker_that_dies_stops_rank_0_instead_of_leaving_it_waiting_and_says_how_it_died(cases):
    proc, worker = _start_ranks(cases["dense"])
    try:
        worker.kill()
        assert proc.wait(60) != 0
        assert "tensor-parallel rank 1 was killed by SIGKILL" in proc.stderr.read()
    finally:
        proc.kill()


def test_a_worker_whose_rank_0_dies_exits(cases):
    proc, worker = _start_ranks(cases["dense"])
    try:
        proc.kill()
        proc.wait()
        worker.wait(60)  # raises psutil.TimeoutExpired if it lingers
    finally:
        if _alive(worker):
            worker.kill()
