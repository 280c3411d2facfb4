"""Contract: every AITER call the adapters make names a function that exists in AITER's source and passes only keywords
that function accepts (and every argument it requires), for each pinned AITER version.

AITER cannot be imported on these machines (it needs ROCm; see shared/docs/AITER.md A0), so the adapters run against a
stand-in `aiter` module built from the pinned signatures (atomlite/model_ops/aiter/signatures.json, generated from the
amd-aiter 0.1.7.post2.dev18 wheel and the ROCm/aiter e4048607 source tree by tools/aiter_signatures.py). A stand-in is
used ONLY here and only for that reason. Each stand-in function records its call and computes, in torch, what AITER
documents the function to compute (test_aiter_semantics.py), so the adapters' argument translation (window, scale,
LSE layout, gathers, layouts) is checked too. None of this runs an AITER kernel.
"""
import copy
import importlib.machinery
import inspect
import sys
import types

import pytest
import torch

from atomlite.distributed.local import run_local
from atomlite.distributed.parallel import TensorParallel, graph_steps
from atomlite.model_ops import aiter as backend, dispatch, torch_ref
from atomlite.model_ops.aiter import detect, functions as F, mxfp4
from atomlite.model_ops.aiter.all_reduce import AiterAllReduce
from atomlite.model_ops.carriers import TokenRows
from atomlite.model_ops.fp8_linear import scale_rows
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.torch_ref.kv_write import to_cache_dtype
from atomlite.model_ops.triton.fp8.quant import quantize_rows
from atomlite.quant import fp8 as ref_fp8
from atomlite.quant import mxfp4 as ref_mxfp4
from test_aiter_semantics import SEMANTICS

VERSIONS = sorted(detect.pinned())
KINDS = {"positional_only": inspect.Parameter.POSITIONAL_ONLY, "keyword_only": inspect.Parameter.KEYWORD_ONLY,
         "positional_or_keyword": inspect.Parameter.POSITIONAL_OR_KEYWORD}
# Defaults the adapters rely on by not passing the argument; a changed default must fail the contract.
DEFAULTS_RELIED_ON = {
    F.RMS_NORM: {"use_model_sensitive_rmsnorm": "0"},
    F.FLASH_VARLEN: {"dropout_p": "0.0", "logits_soft_cap": "0.0", "alibi_slopes": "None", "bias": "None"},
    F.GEMM_A4W4: {"bias": "None", "alpha": "1.0", "beta": "0.0"},
    F.GEMM_A8W8: {"bias": "None", "splitK": "None"},
    F.GEMM_A8W8_BLOCKSCALE: {"isBpreshuffled": "False"},
    F.CUSTOM_ALL_REDUCE_METHODS[1]: {"prefill_support": "False"},
    F.CUSTOM_ALL_REDUCE_METHODS[2]: {"open_fp8_quant": "False", "use_new": "True"},
}


def _signature(spec: dict) -> inspect.Signature:
    params = [inspect.Parameter(p["name"], KINDS[p["kind"]],
                                default=inspect.Parameter.empty if p["default"] is None else p["default"])
              for p in spec["params"]]
    return inspect.Signature(params)


def _recorder(path: str, spec: dict, calls: list):
    def stand_in(*args, **kwargs):
        calls.append((path, args, kwargs))
        return SEMANTICS[path](**kwargs)
    stand_in.__signature__ = _signature(spec)
    return stand_in


def _method_recorder(path: str, spec: dict, calls: list):
    def stand_in(self, *args, **kwargs):
        calls.append((path, args, kwargs))
        return SEMANTICS[path](self, **kwargs)
    stand_in.__signature__ = _signature({"params": [{"name": "self", "kind": "positional_or_keyword",
                                                     "default": None}] + spec["params"]})
    return stand_in


def _class_recorder(path: str, functions: dict, calls: list) -> type:
    """A stand-in class: constructing it and calling its pinned methods are recorded like functions."""
    def __init__(self, *args, **kwargs):
        calls.append((path, args, kwargs))
        SEMANTICS[path](self, **kwargs)
    methods = {p.rpartition(".")[2]: _method_recorder(p, spec, calls) for p, spec in functions.items()
               if p.rpartition(".")[0] == path}
    module, _, name = path.rpartition(".")
    return type(name, (), {"__init__": __init__, "__module__": f"aiter.{module}", "pinned": functions, **methods})


def install_stand_in(monkeypatch, functions: dict, all_reduce_loaded: bool = True) -> list:
    """Put an `aiter` module with `functions` where detect finds it; returns the list calls are recorded in.
    monkeypatch: pytest's, or anything with its setitem (a spawned rank's own). all_reduce_loaded: the flag AITER's
    custom all-reduce module sets when its library loaded."""
    calls, root = [], types.ModuleType("aiter")
    root.__spec__ = importlib.machinery.ModuleSpec("aiter", None)  # found as installed (detect.local_platform)
    modules = {"aiter": root}
    classes = {p.rpartition(".")[0] for p in functions} & set(functions)
    for path, spec in functions.items():
        if path.rpartition(".")[0] in classes:
            continue  # a method: its class holds it
        *parents, name = path.split(".")
        module, dotted = root, "aiter"
        for part in parents:
            dotted += "." + part
            if dotted not in modules:
                modules[dotted] = types.ModuleType(dotted)
                setattr(module, part, modules[dotted])
            module = modules[dotted]
        setattr(module, name, _class_recorder(path, functions, calls) if path in classes
                else _recorder(path, spec, calls))
    flag_module, _, flag = F.CUSTOM_ALL_REDUCE_LOADED.rpartition(".")
    if f"aiter.{flag_module}" in modules:
        setattr(modules[f"aiter.{flag_module}"], flag, all_reduce_loaded)
    for dotted, module in modules.items():
        monkeypatch.setitem(sys.modules, dotted, module)
    monkeypatch.setitem(detect._state, "module", root)
    monkeypatch.setitem(detect._state, "error", None)
    monkeypatch.setitem(detect._state, "tried", True)
    return calls


def contract_problems(calls: list, functions: dict) -> list[str]:
    problems = []
    for path, args, kwargs in calls:
        spec = functions.get(path)
        if spec is None:
            problems.append(f"{path}: no such function in AITER")
            continue
        if args:
            problems.append(f"{path}: called with {len(args)} positional arguments")
        names = {p["name"] for p in spec["params"] if p["kind"] != "positional_only"}
        problems += [f"{path}: no keyword {k!r}" for k in kwargs if k not in names and not spec["var_keyword"]]
        problems += [f"{path}: required {p['name']!r} not passed" for p in spec["params"]
                     if p["default"] is None and p["name"] not in kwargs]
        defaults = {p["name"]: p["default"] for p in spec["params"]}
        problems += [f"{path}: default of {k!r} is {defaults[k]}, adapter assumes {v}"
                     for k, v in DEFAULTS_RELIED_ON.get(path, {}).items()
                     if k in defaults and k not in kwargs and defaults[k] != v]
    return problems


class Batch:
    """A paged cache with a prefill batch (one chunk after a cached prefix, one fresh prompt) and a decode batch."""

    def __init__(self, head_dim=64, heads=4, kv_heads=2, block_size=16, dtype=torch.bfloat16, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.block_size, self.dtype, self.heads, self.head_dim = block_size, dtype, heads, head_dim
        num_blocks = 12
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.k_cache = torch.randn(shape, generator=g).to(dtype)
        self.v_cache = torch.randn(shape, generator=g).to(dtype)
        self.block_table = torch.randperm(num_blocks - 1, generator=g)[:9].add(1).reshape(3, 3).int()
        self.g = g

    def queries(self, counts):
        return torch.randn(sum(counts), self.heads, self.head_dim, generator=self.g).to(self.dtype)

    @staticmethod
    def starts(counts):
        return torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32)


def run_adapters(window=8):
    """Calls every adapter once per route; returns (name, got, want) triples."""
    results = []
    b = Batch()
    for lens, counts in (([27, 5, 40], [7, 5, 1]), ([30, 17, 5], [1, 1, 1])):
        q, qsl, seq_lens = b.queries(counts), Batch.starts(counts), torch.tensor(lens, dtype=torch.int32)
        for w in (window, None):
            args = (q, b.k_cache, b.v_cache, b.block_table[:3], seq_lens, qsl, 0.125, w)
            results.append((f"attention {counts} window={w}", backend.paged_attention(*args),
                            torch_ref.paged_attention(*args)))
        got_o, got_l = backend.paged_attention(*args, return_lse=True)
        want_o, want_l = torch_ref.paged_attention(*args, return_lse=True)
        results += [(f"attention lse {counts}", got_l, want_l), (f"attention lse out {counts}", got_o, want_o)]
    k_new, v_new = b.queries([6])[:, :2], b.queries([6])[:, :2]
    slots = torch.tensor([3, -1, 17, 40, -1, 100])
    got_k, got_v, want_k, want_v = b.k_cache.clone(), b.v_cache.clone(), b.k_cache.clone(), b.v_cache.clone()
    backend.write_kv(k_new, v_new, got_k, got_v, slots)
    torch_ref.write_kv(k_new, v_new, want_k, want_v, slots)
    results += [("write_kv k", got_k, want_k), ("write_kv v", got_v, want_v)]
    results += run_fp8_cache_adapters(b) + run_norm_act_adapters() + run_mxfp4_adapter() + run_fp8_linear_adapter()
    return results + run_encoder_adapter()


def run_encoder_adapter(head_dim=72, heads=4, lengths=(1, 33, 7)):
    from atomlite.model_ops.packed import PackedSequences
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(sum(lengths), heads, head_dim, generator=g).bfloat16() for _ in range(3))
    packed = PackedSequences.of(list(lengths), "cpu")
    return [("encoder_attention", backend.encoder_attention(q, k, v, packed, 0.125),
             torch_ref.encoder_attention(q, k, v, packed, 0.125))]


def run_fp8_cache_adapters(b: Batch):
    """--kv-cache-dtype fp8, at unit scales and at a checkpoint's (K 0.5, V 4): writes quantize, decode reads fp8,
    prefill widens the gathered keys."""
    fp8 = torch.float8_e4m3fn
    results = []
    for scales in ((1.0, 1.0), (0.5, 4.0)):
        k_cache, v_cache = to_cache_dtype(b.k_cache, fp8, scales[0]), to_cache_dtype(b.v_cache, fp8, scales[1])
        for counts, lens in (([7, 5, 1], [27, 5, 40]), ([1, 1, 1], [30, 17, 5])):
            args = (b.queries(counts), k_cache, v_cache, b.block_table[:3], torch.tensor(lens, dtype=torch.int32),
                    Batch.starts(counts), 0.125, None)
            got, want = (op(*args, kv_scales=scales) for op in (backend.paged_attention, torch_ref.paged_attention))
            results.append((f"fp8 attention {counts} scales {scales}", got, want))
        k_new, v_new = b.queries([6])[:, :2], b.queries([6])[:, :2]
        slots = torch.tensor([3, -1, 17, 40, -1, 100])
        got_k, got_v, want_k, want_v = k_cache.clone(), v_cache.clone(), k_cache.clone(), v_cache.clone()
        backend.write_kv(k_new, v_new, got_k, got_v, slots, kv_scales=scales)
        torch_ref.write_kv(k_new, v_new, want_k, want_v, slots, kv_scales=scales)
        results += [(f"fp8 write_kv k scales {scales}", got_k, want_k),
                    (f"fp8 write_kv v scales {scales}", got_v, want_v)]
    return results


def run_norm_act_adapters():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 64, generator=g).bfloat16()
    w = torch.randn(64, generator=g).bfloat16()
    return [("rms_norm", backend.rms_norm(x, w, 1e-6), torch_ref.rms_norm(x, w, 1e-6)),
            ("rms_norm no weight", backend.rms_norm(x, None, 1e-6), torch_ref.rms_norm(x, None, 1e-6)),
            ("gelu_tanh_and_mul", backend.gelu_tanh_and_mul(x), torch_ref.gelu_tanh_and_mul(x))]


def run_mxfp4_adapter():
    g = torch.Generator().manual_seed(3)
    n, k = 48, 320
    packed, scale = ref_mxfp4.quantize(torch.randn(n, k, generator=g))
    x = torch.randn(5, k, generator=g).bfloat16()
    want = (ref_mxfp4.quantize_dequantize(x.float()) @ ref_mxfp4.dequantize(packed, scale).T).bfloat16()
    return [("mxfp4_linear", backend.mxfp4_linear(x, mxfp4.prepare_weight(packed, scale)), want)]


# (spec, each fused part's rows, K): per-channel weights with per-token activations (compressed-tensors FP8-Dynamic),
# per-tensor with a static input scale (Quark fp8; two parts, each its own scale), 128 x 128 blocks with groups of
# 128 (FP8-block; two parts, the last block partial)
FP8_CASES = [(ref_fp8.FP8Spec("channel", "token"), (48,), 320), (ref_fp8.FP8Spec("tensor", "static"), (24, 24), 320),
             (ref_fp8.FP8Spec("block", "group"), (128, 72), 256)]


def fp8_case(spec, parts: tuple[int, ...], k: int, seed: int):
    """(x, weight, atomlite's scales [N, G], input_scale) of a random checkpoint linear fused from parts, each
    quantized on its own as the checkpoint stores them."""
    g = torch.Generator().manual_seed(seed)
    quantized = [ref_fp8.quantize_weight(torch.randn(n, k, generator=g) * 0.05 * (i + 1), spec)
                 for i, n in enumerate(parts)]
    weight = torch.cat([w for w, _ in quantized])
    scale = torch.cat([scale_rows(stored, spec, n, k) for (_, stored), n in zip(quantized, parts)])
    x = torch.randn(5, k, generator=g).bfloat16()
    input_scale = (x.float().abs().amax() / ref_fp8.E4M3_MAX).reshape(1) if spec.static_input else None
    return x, weight, scale, input_scale


def run_fp8_linear_adapter():
    """Each FP8 case through the AITER adapter (prepare once, then a call; per-token rows also as TokenRows; and as
    a down projection's [gate | up], activated as it is quantized) against the checkpoint's semantics
    (quant.fp8.gemm)."""
    from atomlite.model_ops.triton.activation import gelu_tanh_and_mul
    results = []
    for i, (spec, parts, k) in enumerate(FP8_CASES):
        x, weight, scale, input_scale = fp8_case(spec, parts, k, seed=10 + i)
        want = ref_fp8.gemm(x, weight, scale, spec, input_scale)
        prepared = backend.fp8_linear.prepare_weights(weight, scale, spec)
        got = backend.fp8_linear.matmul(x, prepared[0], prepared[1], input_scale, prepared[2], spec)
        results.append((f"fp8_linear {spec.describe()}", got, want))
        gate_up = torch.cat([x, x.flip(0)], dim=1)
        want_gated = ref_fp8.gemm(gelu_tanh_and_mul(gate_up), weight, scale, spec, input_scale)
        results.append((f"fp8_linear gated {spec.describe()}", backend.fp8_linear.matmul_gated(
            gate_up, prepared[0], prepared[1], input_scale, prepared[2], spec), want_gated))
        if spec.activation == "token":
            rows = TokenRows(*quantize_rows(x, "token", prepared[0].dtype), x.dtype)
            results.append((f"fp8_linear token rows {spec.describe()}",
                            backend.fp8_linear.matmul_token_rows(rows, prepared[0], prepared[1], spec), want))
    return results


class SpawnedPatch:
    """monkeypatch.setitem for a spawned rank, whose process ends with its test."""

    @staticmethod
    def setitem(mapping, key, value):
        mapping[key] = value


def rank_rows(rank: int) -> torch.Tensor:
    return torch.randn(4, 64, generator=torch.Generator().manual_seed(rank)).bfloat16()


def all_reduce_adapter_rank(tp: TensorParallel, version: str, out) -> None:
    """One rank of two: CustomAllreduce's whole life through the adapter (made, a graph's capture block, a decode
    row summed, closed). Rank 0 saves its calls (names only: the contract reads no values) and the sum."""
    calls = install_stand_in(SpawnedPatch(), detect.pinned()[version]["functions"])
    comm = AiterAllReduce(tp, torch.device("cpu"))
    with comm.capture(), graph_steps():
        assert comm.serves(rank_rows(tp.rank))
    with graph_steps():
        got = comm.all_reduce(rank_rows(tp.rank))
    comm.close()
    if tp.rank == 0:
        torch.save({"calls": [(path, len(args), sorted(kwargs)) for path, args, kwargs in calls], "got": got}, out)


def run_all_reduce_adapter(version: str, out) -> tuple[list, list]:
    """(calls, results) of all_reduce_adapter_rank over two gloo ranks: AITER's CustomAllreduce disables itself
    in a group of one."""
    run_local(all_reduce_adapter_rank, 2, version, out)
    saved = torch.load(out)
    calls = [(path, (None,) * positional, dict.fromkeys(names)) for path, positional, names in saved["calls"]]
    return calls, [("custom all-reduce of two ranks", saved["got"], rank_rows(0) + rank_rows(1))]


@pytest.fixture(params=VERSIONS)
def pinned_aiter(request, monkeypatch):
    functions = detect.pinned()[request.param]["functions"]
    return functions, install_stand_in(monkeypatch, functions)


@pytest.fixture(scope="module", params=VERSIONS)
def recorded(request, tmp_path_factory):
    """Every adapter run once against one pinned version: (functions, calls, results)."""
    functions = detect.pinned()[request.param]["functions"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        calls = install_stand_in(monkeypatch, functions)
        results = run_adapters()
    ranks_calls, ranks_results = run_all_reduce_adapter(request.param, tmp_path_factory.mktemp("ar") / "rank0.pt")
    return functions, calls + ranks_calls, results + ranks_results


def test_every_adapter_call_matches_the_pinned_aiter_signature(recorded):
    functions, calls, _ = recorded
    assert contract_problems(calls, functions) == []
    called = {path for path, _, _ in calls}
    assert called == F.required()


def test_adapters_compute_what_aiter_documents(recorded):
    for name, got, want in recorded[2]:
        assert got.shape == want.shape, name
        torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=2e-2, msg=name)


def test_a_renamed_keyword_or_missing_function_fails_the_contract(recorded):
    functions, calls, _ = recorded
    renamed = copy.deepcopy(functions)
    for p in renamed[F.FLASH_VARLEN]["params"]:
        if p["name"] == "softmax_scale":
            p["name"] = "sm_scale"
    assert f"{F.FLASH_VARLEN}: no keyword 'softmax_scale'" in contract_problems(calls, renamed)
    del renamed[F.WRITE_KV_NHD]
    assert f"{F.WRITE_KV_NHD}: no such function in AITER" in contract_problems(calls, renamed)
    flipped = copy.deepcopy(functions)
    for p in flipped[F.RMS_NORM]["params"]:
        if p["name"] == "use_model_sensitive_rmsnorm":
            p["default"] = "1"
    assert any("use_model_sensitive_rmsnorm" in p for p in contract_problems(calls, flipped))


def test_gemm_a4w4_gets_a_32_row_out_only_where_aiter_takes_one(pinned_aiter):
    functions, calls = pinned_aiter
    run_mxfp4_adapter()
    (gemm,) = [kw for path, _, kw in calls if path == F.GEMM_A4W4]
    if any(p["name"] == "out" for p in functions[F.GEMM_A4W4]["params"]):
        assert gemm["out"].shape == (32, 48) and "dtype" not in gemm
    else:
        assert gemm["dtype"] == torch.bfloat16 and "out" not in gemm


def test_decode_batches_use_paged_decode_and_others_flash_varlen(pinned_aiter):
    _, calls = pinned_aiter
    b = Batch()
    seq_lens = torch.tensor([30, 17, 5], dtype=torch.int32)
    backend.paged_attention(b.queries([1, 1, 1]), b.k_cache, b.v_cache, b.block_table, seq_lens,
                            Batch.starts([1, 1, 1]), 0.1, 8)
    backend.paged_attention(b.queries([2, 1, 1]), b.k_cache, b.v_cache, b.block_table, seq_lens,
                            Batch.starts([2, 1, 1]), 0.1, 8)
    assert [path for path, _, _ in calls] == [F.PAGED_DECODE, F.FLASH_VARLEN]
    assert calls[0][2]["sliding_window"] == 8 and calls[0][2]["kv_cache_layout"] == "NHD"
    assert calls[1][2]["window_size"] == (7, 0) and calls[1][2]["causal"] is True


def test_a_16_bit_cache_of_the_other_16_bit_dtype_is_left_to_the_reference(pinned_aiter):
    """paged_attention_v1 reads a 16-bit cache as the query's dtype: a float16 cache under bfloat16 activations
    (--kv-cache-dtype float16) would be misread, so the adapter hands that batch to the reference."""
    _, calls = pinned_aiter
    b = Batch()
    k_cache, v_cache = b.k_cache.half(), b.v_cache.half()
    args = (b.queries([1, 1, 1]), k_cache, v_cache, b.block_table, torch.tensor([30, 17, 5], dtype=torch.int32),
            Batch.starts([1, 1, 1]), 0.1, None)
    torch.testing.assert_close(backend.paged_attention(*args), torch_ref.paged_attention(*args))
    assert calls == []


def test_steps_with_key_ends_leave_aiter_for_triton(pinned_aiter, caplog):
    """flash_attn_varlen_func masks causally only: a prefill whose image blocks attend both ways (key_ends) runs on
    Triton, with no AITER call, says so once in the log and matches the reference; without key_ends the same step
    goes to AITER."""
    from atomlite.model_ops.aiter import attention as adapter
    _, calls = pinned_aiter
    b = Batch()
    counts = [7, 5, 1]
    q, qsl, seq_lens = b.queries(counts), Batch.starts(counts), torch.tensor([27, 5, 40], dtype=torch.int32)
    # an image at positions 20-22 after a cached prefix, a prompt that is all image, a decode step
    key_ends = torch.tensor([23, 23, 23, 24, 25, 26, 27, 5, 5, 5, 5, 5, 40], dtype=torch.int32)
    args = (q, b.k_cache, b.v_cache, b.block_table[:3], seq_lens, qsl, 0.125, 8)
    adapter._attention_over_spans.cache_clear()
    with caplog.at_level("INFO", logger="atomlite.aiter"):
        got = backend.paged_attention(*args, key_ends=key_ends)
    assert calls == [] and "so triton serves these steps" in caplog.text
    upcast = [a.float() if a.is_floating_point() else a for a in args[:6]]
    want = torch_ref.paged_attention(*upcast, 0.125, 8, key_ends=key_ends)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    causal = torch_ref.paged_attention(*upcast, 0.125, 8)
    assert (want - causal).abs().max() > 0.1  # the key ends matter here
    backend.paged_attention(*args)
    assert [path for path, _, _ in calls] == [F.FLASH_VARLEN]


def test_encoder_attention_is_flash_varlen_without_the_causal_mask_over_the_packs_bounds(pinned_aiter):
    """The vision tower's packed images: one flash_attn_varlen_func call, causal=False, the pack's cu_seqlens for
    queries and keys and its longest image from the host's lengths."""
    _, calls = pinned_aiter
    run_encoder_adapter(lengths=(9, 36, 18))
    [(path, _, kwargs)] = calls
    assert path == F.FLASH_VARLEN and kwargs["causal"] is False and kwargs["window_size"] == (-1, -1)
    assert kwargs["softmax_scale"] == 0.125
    assert kwargs["cu_seqlens_q"] is kwargs["cu_seqlens_k"] and kwargs["cu_seqlens_q"].tolist() == [0, 9, 45, 63]
    assert kwargs["max_seqlen_q"] == kwargs["max_seqlen_k"] == 36


def test_a_float32_pack_leaves_aiter_for_triton(pinned_aiter):
    """CK's fmha forward takes bf16/fp16 alone: float32 runs on Triton's kernel (in the interpreter here)."""
    from atomlite.model_ops.aiter import encoder as adapter
    from atomlite.model_ops.packed import PackedSequences
    _, calls = pinned_aiter
    adapter._other_dtype.cache_clear()
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(40, 2, 64, generator=g) for _ in range(3))
    packed = PackedSequences.of([30, 10], "cpu")
    got = backend.encoder_attention(q, k, v, packed, 0.125)
    assert calls == [] and adapter._other_dtype(64, 1).__module__ == "atomlite.model_ops.triton.attention.encoder"
    torch.testing.assert_close(got, torch_ref.encoder_attention(q, k, v, packed, 0.125), atol=2e-5, rtol=2e-5)


def test_fp8_linear_adapter_runs_the_checkpoint_semantics_to_the_last_bf16_bit(pinned_aiter):
    """The adapter quantizes x with atomlite's kernel and hands AITER scales in the layouts its references read:
    the product is the checkpoint's, up to float32 summation order (one bf16 ulp)."""
    functions, calls = pinned_aiter
    for name, got, want in run_fp8_linear_adapter():
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-5, msg=name)
    gemms = [(path, kw) for path, _, kw in calls if path in (F.GEMM_A8W8, F.GEMM_A8W8_BLOCKSCALE)]
    # per token: plain, gated, TokenRows; static: plain, gated; blocks: plain, gated
    assert [path for path, _ in gemms] == [F.GEMM_A8W8] * 5 + [F.GEMM_A8W8_BLOCKSCALE] * 2
    assert gemms[-1][1]["w_scale"].shape == (2, 2) and gemms[-1][1]["x_scale"].shape == (5, 2)  # N 200, K 256


BLOCK_FP8 = ref_fp8.FP8Spec("block", "group")


@pytest.mark.parametrize("spec,k,parts,dtype,backend_name,why", [
    (ref_fp8.FP8Spec("channel", "token"), 320, (256,), torch.bfloat16, "aiter", None),
    (ref_fp8.FP8Spec("tensor", "static"), 320, (128, 128), torch.float16, "aiter", None),
    (BLOCK_FP8, 256, (128, 128), torch.bfloat16, "aiter", None),
    (ref_fp8.FP8Spec("channel", None), 320, (256,), torch.bfloat16, "triton",
     "weight-only FP8 (W8A16) is left to Triton"),
    (ref_fp8.FP8Spec("channel", "token"), 320, (256,), torch.float32, "triton", "write bf16 or fp16"),
    (BLOCK_FP8, 320, (256,), torch.bfloat16, "triton", "in_features divisible by 128"),
    # 26B-A4B's fused gate_up: two parts of 2112 rows, so one 128-row block holds rows of both
    (BLOCK_FP8, 256, (192, 64), torch.bfloat16, "triton", "scale blocks that straddle two parts"),
    (ref_fp8.FP8Spec("block", "group", block=(64, 128)), 256, (256,), torch.bfloat16, "triton",
     "not group activations on 64x128 blocks"),
    (ref_fp8.FP8Spec("channel", "group"), 256, (256,), torch.bfloat16, "triton",
     "activations in groups need block-scaled weights"),
])
def test_fp8_linears_take_aiter_where_its_gemms_fit(spec, k, parts, dtype, backend_name, why):
    choice = dispatch.choose("fp8_linear", platform=Platform("rocm", "gfx942", has_aiter=True), n=sum(parts), k=k,
                             weight=spec.weight, activation=spec.activation, block_n=spec.block_n,
                             block_k=spec.block_k, group_size=spec.group_size, shard_sizes=parts, dtype=dtype)
    assert choice.backend == backend_name
    assert why is None or why in choice.reason
