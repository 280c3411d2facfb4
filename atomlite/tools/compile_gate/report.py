"""The compile gate's table: a row per kernel and tile configuration, a column per platform."""
from atomlite.tools.compile_gate.build import KernelResult

# Launch flags that differ by platform for the same tiles (they pick PTX, TMA, dependent launches on NVIDIA), and
# those fixed for bf16 on any GPU (they serve fp32 inputs and the interpreter).
UNSHOWN = {"PTX", "TMA", "PDL", "launch_pdl", "UPCAST", "DOT_PRECISION", "FP32"}


def row_key(result: KernelResult) -> str:
    """Kernel and tiles: constexprs and launch options, without runtime ints Triton fixed at 1 or UNSHOWN."""
    values = [f"{k}={v}" for k, v in result.constexprs.items() if not k.endswith("==") and k not in UNSHOWN]
    tuning = [f"{k}={v}" for k, v in result.options.items() if k not in UNSHOWN]
    return f"`{result.kernel}` {', '.join(values)}; {', '.join(tuning)}"


def _kib(size: int) -> str:
    return f"{size / 1024:.4g}K" if size >= 1024 else f"{size}B"


def cell(results: list[KernelResult]) -> str:
    """The worst figures over a row's specializations on one platform (most registers and spills, least
    occupancy); AMD: VGPR/SGPR, spilled VGPRs, LDS, waves per SIMD; NVIDIA: registers, local bytes, shared
    memory, warps per SM."""
    if not results:
        return "-"
    failed = [r for r in results if r.error]
    if failed:
        return "FAILS: " + failed[0].error.splitlines()[-1][:80].replace("|", "/")
    stats = [r.stats for r in results]
    registers = max(s["registers"] for s in stats)
    scalar = max(s["scalar_registers"] or 0 for s in stats)
    spills = max(s["spills"] for s in stats)
    shared = max(s["shared_bytes"] for s in stats)
    occupancy = min(s["occupancy"] for s in stats)
    regs = f"{registers}/{scalar}" if scalar else f"{registers}"
    return f"{regs} · {spills} · {_kib(shared)} · {occupancy}"


def format_table(results: list[KernelResult]) -> list[str]:
    platforms = list(dict.fromkeys(r.platform for r in results))
    rows: dict[str, dict[str, list[KernelResult]]] = {}
    for result in results:
        rows.setdefault(row_key(result), {}).setdefault(result.platform, []).append(result)
    lines = ["| kernel and tiles | " + " | ".join(platforms) + " |", "|---" * (len(platforms) + 1) + "|"]
    for key, per_platform in sorted(rows.items()):
        lines.append(f"| {key} | " + " | ".join(cell(per_platform.get(p, [])) for p in platforms) + " |")
    return lines


LEGEND = ("cells: AMD VGPRs/SGPRs · spilled VGPRs · LDS bytes · waves per SIMD; NVIDIA registers · local-memory "
          "bytes (spills) · shared memory · warps per SM; the worst over the row's specializations; - = not "
          "launched there")
