"""Check every Triton kernel against torch_ref on the GPU at the benchmark shapes, then time them against
baselines measured in the same run (torch SDPA, device copy bandwidth) and print a table of ratios.

    PYTHONPATH=. python bench/kernels.py [--check-only] [--sweep]
"""
import argparse
import sys

import torch
import triton
from triton.testing import do_bench

from atomlite.model_ops import torch_ref
from atomlite.model_ops import triton as tri
from atomlite.model_ops.triton.attention import paged as tri_attn

BF16 = torch.bfloat16
ROWS = []


def median_ms(fn, rep=200):
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def check(name, out, ref, tol=1e-2):
    err = rel_err(out, ref)
    finite = bool(torch.isfinite(out).all())
    ok = finite and err < tol
    print(f"check {name:<48} rel_err {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def copy_bandwidth() -> float:
    """Bytes read + written per second by a large device-to-device copy."""
    src = torch.randn(512 * 2**20, device="cuda", dtype=BF16)  # 1 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def paged_cache(num_seqs, ctx, num_kv_heads, head_dim, block_size=16, dtype=BF16):
    """Random caches with each sequence's blocks scattered over the pool (block 0 unused: the null block)."""
    blocks_per_seq = triton.cdiv(ctx, block_size)
    num_blocks = 1 + num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device="cuda", dtype=dtype)
    v_cache = torch.randn(shape, device="cuda", dtype=dtype)
    table = (torch.randperm(num_blocks - 1, device="cuda") + 1).to(torch.int32).view(num_seqs, blocks_per_seq)
    seq_lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device="cuda")
    return k_cache, v_cache, table, seq_lens


def row(kernel, shape, ms, achieved, baseline, ratio, target):
    ROWS.append((kernel, shape, f"{ms:.3f}", achieved, baseline, f"{ratio:.2f}", target))


# ---------------------------------------------------------------- attention
def prefill_case(seq_len, num_heads, num_kv_heads, head_dim):
    k_cache, v_cache, table, seq_lens = paged_cache(1, seq_len, num_kv_heads, head_dim)
    k = torch.randn(seq_len, num_kv_heads, head_dim, device="cuda", dtype=BF16)
    v = torch.randn(seq_len, num_kv_heads, head_dim, device="cuda", dtype=BF16)
    slots = (table[0].long()[:, None] * k_cache.shape[1] + torch.arange(k_cache.shape[1], device="cuda")).flatten()
    tri.write_kv(k, v, k_cache, v_cache, slots[:seq_len])
    q = torch.randn(seq_len, num_heads, head_dim, device="cuda", dtype=BF16)
    qsl = torch.tensor([0, seq_len], dtype=torch.int32, device="cuda")
    return q, k, v, (q, k_cache, v_cache, table, seq_lens, qsl)


def sdpa_causal(q, k, v, scale, window=None):
    """torch SDPA on [1, H, S, D] with K/V repeated to every query head."""
    group = q.shape[1] // k.shape[1]
    qt, kt, vt = (t.transpose(0, 1)[None] for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
    if window is None:
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    pos = torch.arange(q.shape[0], device=q.device)
    mask = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < window)
    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)


def sdpa_best_causal_ms(q, k, v, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    group = q.shape[1] // k.shape[1]
    qt, kt, vt = (t.transpose(0, 1)[None].contiguous()
                  for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
    best = None
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                ms = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=True, scale=scale))
        except RuntimeError as exc:
            print(f"  sdpa {backend.name}: unavailable ({str(exc).splitlines()[0][:80]})")
            continue
        print(f"  sdpa {backend.name}: {ms:.3f} ms")
        if best is None or ms < best[0]:
            best = (ms, backend.name)
    return best


def check_prefill(seq_len, num_heads, num_kv_heads, head_dim, window):
    q, k, v, args = prefill_case(seq_len, num_heads, num_kv_heads, head_dim)
    scale = head_dim ** -0.5
    out = tri.paged_attention(*args, scale, window)
    ref = sdpa_causal(q.float(), k.float(), v.float(), scale, window)[0].transpose(0, 1)
    return check(f"attention prefill S={seq_len} D={head_dim} {num_heads}/{num_kv_heads} w={window}", out, ref)


def check_mixed_batch(head_dim, window, splits):
    """Chunked prefill + decode + prefix hits in one batch, with LSE, against torch_ref (fp32 upcast)."""
    q_lens, k_lens = [0, 1, 1, 300, 77, 512], [9, 1, 2000, 900, 77, 3000]
    num_heads, num_kv_heads, block_size = 8, 2, 16
    blocks = [triton.cdiv(n, block_size) for n in k_lens]
    k_cache = torch.randn(1 + sum(blocks), block_size, num_kv_heads, head_dim, device="cuda", dtype=BF16)
    v_cache = torch.randn_like(k_cache)
    perm = (torch.randperm(sum(blocks), device="cuda") + 1).to(torch.int32)
    table = torch.zeros(len(k_lens), max(blocks), dtype=torch.int32, device="cuda")
    start = 0
    for b, n in enumerate(blocks):
        table[b, :n] = perm[start:start + n]
        start += n
    q = torch.randn(sum(q_lens), num_heads, head_dim, device="cuda", dtype=BF16)
    qsl = torch.tensor([0] + q_lens, device="cuda").cumsum(0).to(torch.int32)
    seq_lens = torch.tensor(k_lens, dtype=torch.int32, device="cuda")
    args = (q, k_cache, v_cache, table, seq_lens, qsl)
    config = tri_attn.pick_config(q, k_cache, table, num_heads // num_kv_heads)
    config = tri_attn.AttnConfig(config.block_m, config.block_n, config.num_warps, config.num_stages, splits)
    out, lse = tri_attn.launch(*args, 0.05, window, True, config)
    ref_out, ref_lse = torch_ref.paged_attention(*[a.float() if a.is_floating_point() else a for a in args],
                                                 0.05, window, True)
    name = f"attention mixed batch D={head_dim} w={window} splits={splits}"
    return check(name, out, ref_out) & check(name + " lse", lse, ref_lse, 1e-4)


def decode_case(num_seqs, ctx, num_heads, num_kv_heads, head_dim):
    k_cache, v_cache, table, seq_lens = paged_cache(num_seqs, ctx, num_kv_heads, head_dim)
    q = torch.randn(num_seqs, num_heads, head_dim, device="cuda", dtype=BF16)
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device="cuda")
    return (q, k_cache, v_cache, table, seq_lens, qsl)


def time_prefill(seq_len, num_heads, num_kv_heads, head_dim, window, sweep, copy_bw):
    q, k, v, args = prefill_case(seq_len, num_heads, num_kv_heads, head_dim)
    scale = head_dim ** -0.5
    configs = [tri_attn.pick_config(q, args[1], args[3], num_heads // num_kv_heads)]
    if sweep:
        configs += SWEEP_PREFILL.get(head_dim, [])
    results = []
    for config in configs:
        try:
            ms = median_ms(lambda: tri_attn.launch(*args, scale, window, False, config))
        except Exception as exc:  # noqa: BLE001 -- a config that does not fit is reported, not fatal
            print(f"  {config}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})")
            continue
        print(f"  {config}: {ms:.3f} ms", flush=True)
        results.append((ms, config))
    ms, config = min(results, key=lambda r: r[0])
    if window is None:
        flops = 4 * num_heads * head_dim * seq_len * (seq_len + 1) / 2
    else:
        keys = sum(min(i + 1, window) for i in range(seq_len))
        flops = 4 * num_heads * head_dim * keys
    return ms, flops, config


SWEEP_PREFILL = {
    512: [tri_attn.AttnConfig(64, 64, 8, 1), tri_attn.AttnConfig(64, 16, 8, 3)],
    256: [tri_attn.AttnConfig(64, 64, 4, 2), tri_attn.AttnConfig(128, 32, 8, 3)],
}
SWEEP_DECODE = [(16, 64, 4, 2)]


def bench_attention(sweep, copy_bw):
    s, hq = 8192, 32
    ms, flops, config = time_prefill(s, hq, 4, 512, None, sweep, copy_bw)
    q, k, v, _ = prefill_case(s, hq, 4, 512)
    best = sdpa_best_causal_ms(q, k, v, 512 ** -0.5)
    base = median_ms(lambda: sdpa_causal(q, k, v, 512 ** -0.5), rep=500)
    print(f"  sdpa default: {base:.3f} ms")
    if best is not None and best[0] < base:
        base, name = best
    else:
        name = "default"
    tf, base_tf = flops / ms / 1e9, flops / base / 1e9
    row("attention prefill causal", f"S={s} D=512 32q/4kv", ms, f"{tf:.0f} TFLOP/s",
        f"SDPA {name} {base_tf:.0f} TFLOP/s", base / ms, f">= 250 TFLOP/s: {'met' if tf >= 250 else 'MISSED'}")
    print(f"  chosen {config}")

    ms, flops, config = time_prefill(s, hq, 16, 256, 1024, sweep, copy_bw)
    q, k, v, _ = prefill_case(s, hq, 16, 256)
    best = sdpa_best_causal_ms(q, k, v, 256 ** -0.5)
    full_flops = 4 * hq * 256 * s * (s + 1) / 2
    row("attention prefill window 1024", f"S={s} D=256 32q/16kv", ms, f"{flops / ms / 1e9:.0f} TFLOP/s",
        f"SDPA {best[1]} full causal {best[0]:.3f} ms ({full_flops / best[0] / 1e9:.0f} TFLOP/s)", best[0] / ms,
        f"faster than SDPA: {'met' if ms < best[0] else 'MISSED'}")

    for head_dim, num_kv_heads in ((256, 16), (512, 4)):
        args = decode_case(32, s, hq, num_kv_heads, head_dim)
        base_config = tri_attn.pick_config(args[0], args[1], args[3], hq // num_kv_heads)
        configs = [base_config]
        if sweep:
            configs += [tri_attn.AttnConfig(*c, splits) for c in SWEEP_DECODE for splits in (1, 2)]
        results = []
        for config in configs:
            try:
                t = median_ms(lambda: tri_attn.launch(*args, head_dim ** -0.5, None, False, config))
            except Exception as exc:  # noqa: BLE001
                print(f"  {config}: failed ({type(exc).__name__})")
                continue
            print(f"  decode D={head_dim} {config}: {t:.3f} ms", flush=True)
            results.append((t, config))
        ms, config = min(results, key=lambda r: r[0])
        kv_bytes = 2 * 32 * s * num_kv_heads * head_dim * 2
        bw = kv_bytes / (ms * 1e-3)
        row("attention decode", f"B=32 ctx={s} D={head_dim} 32q/{num_kv_heads}kv", ms, f"{bw / 1e12:.2f} TB/s KV",
            f"copy {copy_bw / 1e12:.2f} TB/s", bw / copy_bw, f">= 0.70: {'met' if bw >= 0.7 * copy_bw else 'MISSED'}")
        print(f"  chosen {config} (default {base_config})")


# ---------------------------------------------------------------- other ops
def bench_norm(copy_bw):
    x = torch.randn(8192, 5376, device="cuda", dtype=BF16)
    w = torch.randn(5376, device="cuda", dtype=BF16)
    ms = median_ms(lambda: tri.rms_norm(x, w, 1e-6))
    ref_ms = median_ms(lambda: torch_ref.rms_norm(x, w, 1e-6))
    bw = 2 * x.numel() * 2 / (ms * 1e-3)
    row("rms_norm", "T=8192 hidden=5376 bf16", ms, f"{bw / 1e12:.2f} TB/s",
        f"copy {copy_bw / 1e12:.2f} TB/s (torch_ref {ref_ms:.3f} ms)", bw / copy_bw,
        f">= 0.80: {'met' if bw >= 0.8 * copy_bw else 'MISSED'}")


def bench_small_ops(copy_bw):
    t = 4096
    x = torch.randn(t, 2 * 16384, device="cuda", dtype=BF16)
    cases = [
        ("gelu_tanh_and_mul", f"T={t} I={x.shape[1] // 2}", lambda: tri.gelu_tanh_and_mul(x),
         lambda: torch_ref.gelu_tanh_and_mul(x), x.numel() * 2 * 1.5),
    ]
    for name, shape, fn, ref_fn, nbytes in cases:
        ms, ref_ms = median_ms(fn), median_ms(ref_fn)
        bw = nbytes / (ms * 1e-3)
        row(name, shape, ms, f"{bw / 1e12:.2f} TB/s", f"torch_ref {ref_ms:.3f} ms", bw / copy_bw, "(no target)")


# ---------------------------------------------------------------- checks at the benchmark shapes
def run_checks() -> bool:
    ok = check_prefill(8192, 32, 4, 512, None)
    ok &= check_prefill(8192, 32, 16, 256, 1024)
    for head_dim, num_kv_heads in ((256, 16), (512, 4)):
        args = decode_case(32, 8192, 32, num_kv_heads, head_dim)
        out = tri.paged_attention(*args, 0.05)
        ref = torch_ref.paged_attention(*[a.float() if a.is_floating_point() else a for a in args], 0.05)
        ok &= check(f"attention decode B=32 ctx=8192 D={head_dim}", out, ref)
    for head_dim in (64, 256, 512):
        for window, splits in ((None, 1), (700, 1), (None, 5), (300, 3)):
            ok &= check_mixed_batch(head_dim, window, splits)
    x = torch.randn(4096, 5376, device="cuda", dtype=BF16)
    w = torch.randn(5376, device="cuda", dtype=BF16)
    ok &= check("rms_norm", tri.rms_norm(x, w, 1e-6), torch_ref.rms_norm(x.float(), w.float(), 1e-6))
    ok &= check("rms_norm weightless", tri.rms_norm(x, None, 1e-6), torch_ref.rms_norm(x.float(), None, 1e-6))
    gu = torch.randn(4096, 2 * 2112, device="cuda", dtype=BF16)
    ok &= check("gelu_tanh_and_mul", tri.gelu_tanh_and_mul(gu), torch_ref.gelu_tanh_and_mul(gu.float()))
    k, v = (torch.randn(4096, 4, 512, device="cuda", dtype=BF16) for _ in range(2))
    slots = torch.randperm(300 * 16, device="cuda")[:4096]
    slots[::7] = -1
    caches = [torch.randn(300, 16, 4, 512, device="cuda", dtype=BF16) for _ in range(2)]
    copies = [c.clone() for c in caches]
    tri.write_kv(k, v, *caches, slots)
    torch_ref.write_kv(k, v, *copies, slots)
    same = torch.equal(caches[0], copies[0]) and torch.equal(caches[1], copies[1])
    print(f"check {'write_kv':<48} {'ok' if same else 'FAIL'}")
    return ok and same


def resource_report():
    """Registers, spills and shared memory of every attention variant compiled in this run (from triton's cache)."""
    shown = ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "HAS_WINDOW", "SPLIT_KV")
    fn = tri_attn._attention_kernel
    try:
        for caches in fn.device_caches.values():
            for kernel in caches[0].values():
                consts = {fn.arg_names[k[0]]: v for k, v in kernel.src.constants.items()
                          if isinstance(k, tuple) and len(k) == 1 and fn.arg_names[k[0]] in shown}
                meta = kernel.metadata
                print(f"  attention {consts}: regs {kernel.n_regs} spills {kernel.n_spills} smem {meta.shared} "
                      f"warps {meta.num_warps} stages {meta.num_stages}")
    except Exception as exc:  # noqa: BLE001 -- diagnostics only
        print(f"  (no resource report: {type(exc).__name__}: {exc})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="also time a few alternative tile configs")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    if not run_checks():
        print("CHECKS FAILED")
        sys.exit(1)
    if args.check_only:
        return
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth (read + write): {copy_bw / 1e12:.2f} TB/s", flush=True)
    bench_attention(args.sweep, copy_bw)
    bench_norm(copy_bw)
    bench_small_ops(copy_bw)
    resource_report()
    header = ("kernel", "shape", "ms", "achieved", "baseline (same run)", "ratio", "target")
    widths = [max(len(str(r[i])) for r in ROWS + [header]) for i in range(len(header))]
    for r in [header] + ROWS:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
