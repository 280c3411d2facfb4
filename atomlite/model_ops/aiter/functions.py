"""The AITER functions each atomlite op calls, by the path atomlite resolves: `name` is `aiter.name`,
`a.b.name` is `aiter.a.b.name`. Each AITER kernel's declaration `requires` the ones it calls; tools/aiter_signatures.py
pins exactly these; the contract test checks every call."""

FLASH_VARLEN = "flash_attn_varlen_func"
PAGED_DECODE = "paged_attention_v1"
WRITE_KV_NHD = "reshape_and_cache_flash"
RMS_NORM = "rmsnorm2d_fwd"
GELU_TANH_AND_MUL = "gelu_tanh_and_mul"
GEMM_A4W4 = "gemm_a4w4"
GEMM_A8W8 = "gemm_a8w8"
GEMM_A8W8_BLOCKSCALE = "gemm_a8w8_blockscale"
MXFP4_QUANT = "utility.fp4_utils.dynamic_mxfp4_quant"
# A class: its path pins __init__'s parameters; atomlite calls these methods of its instances by keyword.
CUSTOM_ALL_REDUCE = "dist.device_communicators.custom_all_reduce.CustomAllreduce"
CUSTOM_ALL_REDUCE_METHODS = tuple(f"{CUSTOM_ALL_REDUCE}.{m}" for m in ("capture", "should_custom_ar",
                                                                      "custom_all_reduce", "close"))
# A module flag, not a function: False when AITER's all-reduce library failed to load (model_ops/aiter/all_reduce.py).
CUSTOM_ALL_REDUCE_LOADED = "dist.device_communicators.custom_all_reduce.custom_ar"

# Not called: atomlite re-implements these layouts in torch (mxfp4.py); pinned so that a change of the reference's
# signature shows up when the file is regenerated.
LAYOUT_REFERENCES = ("ops.shuffle.shuffle_weight", "utility.fp4_utils.e8m0_shuffle")


def required() -> set[str]:
    """Every function an AITER kernel requires (its declaration's `requires`)."""
    from atomlite.model_ops import kernels
    return {path for kernel in kernels.kernels_of("aiter").values() for path in kernel.requires}


def all_paths() -> tuple[str, ...]:
    """What tools/aiter_signatures.py pins: the required functions and the layout references."""
    return tuple(sorted(required() | set(LAYOUT_REFERENCES)))
