"""The ops: one name per computation layers ask model_ops.dispatch for, with one signature across backends (the
torch reference's, in model_ops/torch_ref/). A kernel declares which op it serves (model_ops.kernels); adding an op is
one entry here plus its reference kernel."""

OPS = {
    "attention": "paged attention over the KV cache, prefill and decode (torch_ref.attention.paged_attention)",
    "encoder_attention": "bidirectional attention within each of several packed sequences, no KV cache (a vision "
                         "tower's images; torch_ref.encoder_attention)",
    "local_attention": "attention of each frame to a window of frames around it within its own sequence, relative-"
                       "position keys added, logits soft-capped (an audio conformer's; torch_ref.local_attention)",
    "axial_qkv_norm_rope": "a vision tower's q/k/v per-head norms and 2-D RoPE (torch_ref.axial_norm_rope)",
    "write_kv": "stores a step's K/V at their cache slots (torch_ref.kv_write)",
    "linear": "y = x W^T in the model's dtype (torch_ref.linear)",
    "rms_norm": "RMSNorm of rows (torch_ref.norm.rms_norm)",
    "rms_norm_residual": "the residual update: norm a branch's output, add it to the residual, norm the sum for the "
                         "next branch (torch_ref.norm.rms_norm_residual)",
    "qk_norm_rope": "q/k norms, RoPE, v norm and the KV write of an attention layer (torch_ref.qk_norm_rope)",
    "gelu_tanh_and_mul": "gelu_tanh(gate) * up of [gate | up] (torch_ref.activation)",
    "router": "the MoE router's logits GEMM and its top-k (torch_ref.router.router)",
    "router_topk": "the MoE router's softmax top-k of given logits (torch_ref.router.router_topk)",
    "moe_experts": "the routed experts of a MoE layer, summed over each token's experts (torch_ref.moe)",
    "mxfp4_linear": "a linear on MXFP4 weights, prepared at load (a family object: torch_ref.mxfp4_family)",
    "mxfp4_moe_experts": "the routed experts on MXFP4 weights (a family object: torch_ref.mxfp4_family)",
    "fp8_linear": "a linear on FP8 weights with the checkpoint's activation quantization (torch_ref.fp8)",
    "fp8_moe_experts": "the routed experts on FP8 weights (torch_ref.fp8)",
    "lora_shrink": "each row's LoRA A: x @ A[slot]^T per row, its slot chosen per row, 0 where none "
                   "(torch_ref.lora)",
    "lora_expand": "each row's LoRA B added into a projection's output, per fused slice (torch_ref.lora)",
    "one_shot_all_reduce": "tensor parallelism's all-reduce in graphs over peer memory (no reference: the "
                           "collective library sums)",
    "custom_all_reduce": "a tensor-parallel group's communicator for small all-reduces (a factory)",
}
