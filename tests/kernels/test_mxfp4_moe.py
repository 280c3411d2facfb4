"""MXFP4 MoE experts: loading Quark's per-expert tensors into the stacked layout, and the Triton path (the fused
MoE kernels on packed FP4 weights; on CPU under TRITON_INTERPRET=1) against the dequantized float experts."""
import pytest
import torch

from atomlite.model_ops import dispatch
from atomlite.model_ops.platform import detect_platform
from atomlite.model_ops.torch_ref.moe import moe_experts
from atomlite.quant import mxfp4
from atomlite.model_ops.mxfp4_moe import MXFP4Experts
from atomlite.quant.quark import LinearQuantSpec

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EXPERTS, HIDDEN, INTER = 4, 64, 96


def per_expert_tensors(seed: int, hidden: int = HIDDEN, inter: int = INTER) -> dict[str, tuple[torch.Tensor,
                                                                                                torch.Tensor]]:
    """Quark's export names -> (packed weight, scales), as one Linear per expert and projection."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for e in range(EXPERTS):
        for proj, (n, k) in {"gate_proj": (inter, hidden), "up_proj": (inter, hidden),
                             "down_proj": (hidden, inter)}.items():
            tensors[f"{e}.{proj}"] = mxfp4.quantize(torch.randn(n, k, generator=gen) * 0.1)
    return tensors


def loaded_experts(tensors, backend: str, hidden: int = HIDDEN, inter: int = INTER) -> MXFP4Experts:
    with dispatch.use(detect_platform(torch.device(DEVICE)), backend):
        experts = MXFP4Experts(EXPERTS, hidden, inter, LinearQuantSpec(dynamic_fp4_input=True))
    assert experts.backend == backend and experts.graph_safe == (backend == "triton")
    for e in range(EXPERTS):
        for proj, stacked, part in (("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1),
                                    ("down_proj", "down_proj", 0)):
            shard = e if stacked == "down_proj" else 2 * e + part
            weight, scale = tensors[f"{e}.{proj}"]
            getattr(experts, stacked).weight_loader(getattr(experts, stacked), weight, shard)
            param = getattr(experts, f"{stacked}_scale")
            param.weight_loader(param, scale, shard)
    experts.process_after_loading()
    return experts.to(DEVICE)


def float_reference(tensors, x, weights, ids) -> torch.Tensor:
    """The float experts on dequantized weights, with the MXFP4 input quantization of each projection."""
    deq = {name: mxfp4.dequantize(*packed) for name, packed in tensors.items()}
    out = torch.zeros_like(x)
    for k in range(ids.shape[1]):
        for t in range(x.shape[0]):
            e = int(ids[t, k])
            xq = mxfp4.quantize_dequantize(x[t:t + 1])
            gate, up = xq @ deq[f"{e}.gate_proj"].T, xq @ deq[f"{e}.up_proj"].T
            h = mxfp4.quantize_dequantize(torch.nn.functional.gelu(gate, approximate="tanh") * up)
            out[t] += weights[t, k] * (h @ deq[f"{e}.down_proj"].T)[0]
    return out


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("hidden,inter", [(HIDDEN, INTER), (48, 24)])  # 48, 24: a partial last 32-block
def test_mxfp4_experts_match_dequantized_reference(backend, hidden, inter):
    tensors = per_expert_tensors(seed=0, hidden=hidden, inter=inter)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, hidden, generator=gen)
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:2] for _ in range(9)])
    weights = torch.rand(9, 2, generator=gen)
    experts = loaded_experts(tensors, backend, hidden, inter)
    got = experts(x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE)).cpu()
    expected = float_reference(tensors, x, weights, ids)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


def test_stacked_layout_is_gate_then_up_per_expert():
    """Without input quantization the MXFP4 experts equal the float experts on the stacked dequantized weights."""
    tensors = per_expert_tensors(seed=2)
    experts = loaded_experts(tensors, "torch").cpu()
    experts.spec = LinearQuantSpec(dynamic_fp4_input=False)
    gate_up = torch.stack([torch.cat([mxfp4.dequantize(*tensors[f"{e}.gate_proj"]),
                                      mxfp4.dequantize(*tensors[f"{e}.up_proj"])]) for e in range(EXPERTS)])
    down = torch.stack([mxfp4.dequantize(*tensors[f"{e}.down_proj"]) for e in range(EXPERTS)])
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(3))
    ids = torch.tensor([[0, 3], [1, 2], [3, 1], [2, 0], [0, 1]])
    weights = torch.full((5, 2), 0.5)
    torch.testing.assert_close(experts(x, weights, ids), moe_experts(x, gate_up, down, weights, ids))


def test_one_fused_float_tensor_for_quantized_experts_names_the_fix():
    experts = MXFP4Experts(EXPERTS, HIDDEN, INTER, LinearQuantSpec(dynamic_fp4_input=True))
    with pytest.raises(ValueError, match="preprocess_for_quantization"):
        experts.gate_up_proj.weight_loader(experts.gate_up_proj, torch.zeros(EXPERTS, 2 * INTER, HIDDEN))


def test_partial_last_block_is_stored_as_quark_exports_it():
    experts = MXFP4Experts(EXPERTS, 48, 24, LinearQuantSpec(dynamic_fp4_input=True))
    assert experts.down_proj.shape == (EXPERTS, 48, 12) and experts.down_proj_scale.shape == (EXPERTS, 48, 1)
    assert experts.gate_up_proj_scale.shape == (EXPERTS, 48, 2)


def test_odd_sizes_cannot_be_packed():
    with pytest.raises(ValueError, match="even sizes .* got 25"):
        MXFP4Experts(EXPERTS, HIDDEN, 25, LinearQuantSpec(dynamic_fp4_input=True))
