"""Register, spill, shared-memory and occupancy figures of a compiled kernel: from the AMDGCN assembly's metadata
on AMD, from cuobjdump's resource usage of the cubin on NVIDIA (the counts Triton reads from the driver at load
time, which needs a GPU)."""
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass

from triton import knobs

# An SM of sm_90: 64K 32-bit registers, 228 KiB of shared memory, 64 warps.
SM90_REGISTERS, SM90_SHARED, SM90_WARPS = 65536, 228 * 1024, 64


@dataclass
class KernelStats:
    registers: int  # VGPRs (AMD, AGPRs included) or registers per thread (NVIDIA)
    scalar_registers: int | None  # SGPRs (AMD)
    spills: int  # VGPRs spilled (AMD) or local-memory bytes per thread (NVIDIA)
    scalar_spills: int | None  # SGPRs spilled to VGPR lanes (AMD; no memory traffic)
    shared_bytes: int  # LDS (AMD) or shared memory per program
    occupancy: int  # waves per SIMD (AMD) or warps per SM (NVIDIA)

    def as_dict(self) -> dict:
        return asdict(self)


def _amd_value(asm: str, pattern: str) -> int:
    match = re.search(pattern, asm)
    if match is None:
        raise ValueError(f"AMDGCN assembly lacks {pattern!r}")
    return int(match.group(1))


def amd_stats(asm: str, shared: int) -> KernelStats:
    return KernelStats(
        registers=_amd_value(asm, r"; TotalNumVgprs: (\d+)"),
        scalar_registers=_amd_value(asm, r"\.sgpr_count:\s+(\d+)"),
        spills=_amd_value(asm, r"\.vgpr_spill_count:\s+(\d+)"),
        scalar_spills=_amd_value(asm, r"\.sgpr_spill_count:\s+(\d+)"),
        shared_bytes=shared,
        occupancy=_amd_value(asm, r"; Occupancy: (\d+)"))


def _cubin_resources(cubin: bytes) -> dict[str, int]:
    tool = os.path.join(os.path.dirname(knobs.nvidia.ptxas.path), "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run([tool, "-res-usage", file.name], capture_output=True, text=True, check=True).stdout
    return {key: int(value) for key, value in re.findall(r"\b(REG|LOCAL|SHARED):(\d+)", text)}


def nvidia_stats(cubin: bytes, dynamic_shared: int, num_warps: int) -> KernelStats:
    used = _cubin_resources(cubin)
    shared = used.get("SHARED", 0) + dynamic_shared
    per_warp = -(-used["REG"] * 32 // 256) * 256  # registers are allocated per warp in units of 256
    programs = min(SM90_REGISTERS // (per_warp * num_warps), SM90_WARPS // num_warps,
                   SM90_SHARED // shared if shared else 32, 32)
    return KernelStats(used["REG"], None, used.get("LOCAL", 0), None, shared, programs * num_warps)


def kernel_stats(compiled) -> KernelStats:
    if "amdgcn" in compiled.asm:
        return amd_stats(compiled.asm["amdgcn"], compiled.metadata.shared)
    return nvidia_stats(compiled.asm["cubin"], compiled.metadata.shared, compiled.metadata.num_warps)
