"""The AITER functions each atomlite op calls, by the path atomlite resolves: `name` is `aiter.name`,
`a.b.name` is `aiter.a.b.name`. tools/aiter_signatures.py pins exactly these; the contract test checks every call."""

FLASH_VARLEN = "flash_attn_varlen_func"
PAGED_DECODE = "paged_attention_v1"
WRITE_KV_NHD = "reshape_and_cache_flash"
RMS_NORM = "rmsnorm2d_fwd"
GELU_TANH_AND_MUL = "gelu_tanh_and_mul"
GEMM_A4W4 = "gemm_a4w4"
MXFP4_QUANT = "utility.fp4_utils.dynamic_mxfp4_quant"
# A class: its path pins __init__'s parameters; atomlite calls these methods of its instances by keyword.
CUSTOM_ALL_REDUCE = "dist.device_communicators.custom_all_reduce.CustomAllreduce"
CUSTOM_ALL_REDUCE_METHODS = tuple(f"{CUSTOM_ALL_REDUCE}.{m}" for m in ("capture", "should_custom_ar",
                                                                      "custom_all_reduce", "close"))
# A module flag, not a function: False when AITER's all-reduce library failed to load (model_ops/aiter/all_reduce.py).
CUSTOM_ALL_REDUCE_LOADED = "dist.device_communicators.custom_all_reduce.custom_ar"

# Functions an op needs before dispatch may pick AITER for it.
REQUIRED = {
    "attention": (FLASH_VARLEN, PAGED_DECODE),
    "encoder_attention": (FLASH_VARLEN,),
    "write_kv": (WRITE_KV_NHD,),
    "rms_norm": (RMS_NORM,),
    "gelu_tanh_and_mul": (GELU_TANH_AND_MUL,),
    "mxfp4_linear": (GEMM_A4W4, MXFP4_QUANT),
    "custom_all_reduce": (CUSTOM_ALL_REDUCE, *CUSTOM_ALL_REDUCE_METHODS),
}

# Not called: atomlite re-implements these layouts in torch (mxfp4.py); pinned so that a change of the reference's
# signature shows up when the file is regenerated.
LAYOUT_REFERENCES = ("ops.shuffle.shuffle_weight", "utility.fp4_utils.e8m0_shuffle")

ALL_PATHS = tuple(sorted({p for paths in REQUIRED.values() for p in paths} | set(LAYOUT_REFERENCES)))
