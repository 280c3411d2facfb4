"""The AITER functions each atomlite op calls, by the path atomlite resolves: `name` is `aiter.name`,
`a.b.name` is `aiter.a.b.name`. tools/aiter_signatures.py pins exactly these; the contract test checks every call."""

FLASH_VARLEN = "flash_attn_varlen_func"
PAGED_DECODE = "paged_attention_v1"
ASM_DECODE = "pa_fwd_asm"
WRITE_KV_NHD = "reshape_and_cache_flash"
WRITE_KV_ASM = "reshape_and_cache"
RMS_NORM = "rmsnorm2d_fwd"
ADD_RMS_NORM = "rmsnorm2d_fwd_with_add"
GELU_TANH_AND_MUL = "gelu_tanh_and_mul"
GEMM_A4W4 = "gemm_a4w4"
MXFP4_QUANT = "utility.fp4_utils.dynamic_mxfp4_quant"

# Functions an op needs before dispatch may pick AITER for it. pa_fwd_asm / reshape_and_cache serve only caches
# allocated in the ASM layout (kv_layout.py), so they are not required for the op itself.
REQUIRED = {
    "attention": (FLASH_VARLEN, PAGED_DECODE),
    "write_kv": (WRITE_KV_NHD,),
    "rms_norm": (RMS_NORM,),
    "add_rms_norm": (ADD_RMS_NORM,),
    "gelu_tanh_and_mul": (GELU_TANH_AND_MUL,),
    "mxfp4_linear": (GEMM_A4W4, MXFP4_QUANT),
}

# Not called: atomlite re-implements these layouts in torch (mxfp4.py, kv_layout.py); pinned so that a change of
# the reference's signature shows up when the file is regenerated.
LAYOUT_REFERENCES = ("ops.shuffle.shuffle_weight", "utility.fp4_utils.e8m0_shuffle")

ALL_PATHS = tuple(sorted({p for paths in REQUIRED.values() for p in paths} | {ASM_DECODE, WRITE_KV_ASM}
                         | set(LAYOUT_REFERENCES)))
