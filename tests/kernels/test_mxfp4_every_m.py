"""Every MXFP4 path at every row count a step can hold (1 .. max_num_batched_tokens + max_num_seqs at the defaults):
the Linear (plain and gated) and the MoE experts on the GPU against the torch backend on the same weights. Mixed
steps have row counts no decode or prefill benchmark hits (31B MXFP4 failed in cuBLAS at one of them)."""
import pytest
import torch

from atomlite.model_ops import dispatch
from atomlite.model_ops.activation import GeluTanhAndMul
from atomlite.model_ops.fusion import link_feed
from atomlite.model_ops.mxfp4_linear import MXFP4Linear
from atomlite.model_ops.platform import detect_platform
from atomlite.model_ops.triton.mxfp4.row_copy import supported as row_copy_supported
from atomlite.quant import mxfp4
from atomlite.quant.quark import LinearQuantSpec
from test_mxfp4_moe import loaded_experts, per_expert_tensors, EXPERTS

pytestmark = pytest.mark.gpu
COPIES = pytest.mark.skipif(not torch.cuda.is_available() or not row_copy_supported(detect_platform(
    torch.device("cuda"))), reason="e4m3 weight copies: NVIDIA sm_89 and newer")
MAX_ROWS = 2048 + 64
N, K = 512, 1024


def built_for(backend: str):
    return dispatch.use(detect_platform(torch.device("cuda")), backend)


def linear(backend: str, packed, scale, row_copy: bool = False) -> MXFP4Linear:
    with built_for(backend):
        layer = MXFP4Linear(K, N, LinearQuantSpec(dynamic_fp4_input=True))
    layer.weight.data, layer.weight_scale.data = packed.clone(), scale.clone()
    layer.process_after_loading()
    layer = layer.cuda()
    if row_copy:  # as make_row_copies leaves it where the GPU has the memory
        assert layer.copies_rows() and layer.make_row_copy()
    return layer


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return (torch.linalg.norm(got.float() - want.float()) / torch.linalg.norm(want.float())).item()


def error_at(fast, reference, inputs: torch.Tensor, m: int) -> str:
    return f"at {m} rows the error is {relative(fast(inputs[:m]), reference(inputs[:m])):.3g} of the norm"


def bf16_experts(tensors, backend: str):
    """Built under bf16 as a bf16 model builds them (the default dtype picks the kernel)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return loaded_experts(tensors, backend, 256, 128)
    finally:
        torch.set_default_dtype(previous)


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within 5% in norm: the fast paths keep the gated activation in fp32 where the torch backend rounds it to bf16
    first, so elements near an e2m1 rounding boundary land one step apart (2.2-2.5% of the norm measured at every
    row count on an H100); a broken row count is off by O(1)."""
    return bool((torch.linalg.norm(got.float() - want.float()) <= 5e-2 * torch.linalg.norm(want.float())).item())


@pytest.mark.parametrize("row_copy", [False, pytest.param(True, marks=COPIES)])
def test_linear_takes_every_row_count(row_copy):
    gen = torch.Generator().manual_seed(0)
    packed, scale = mxfp4.quantize(torch.randn(N, K, generator=gen) * 0.05)
    fast, reference = linear("triton", packed, scale, row_copy), linear("torch", packed, scale)
    x_all = torch.randn(MAX_ROWS, K, generator=gen).to("cuda", torch.bfloat16)
    wrong = [m for m in range(1, MAX_ROWS + 1) if not close(fast(x_all[:m]), reference(x_all[:m]))]
    assert not wrong, f"row counts off the reference: {wrong[:20]}; {error_at(fast, reference, x_all, wrong[0])}"


@pytest.mark.parametrize("row_copy", [False, pytest.param(True, marks=COPIES)])
def test_gated_linear_takes_every_row_count(row_copy):
    gen = torch.Generator().manual_seed(1)
    packed, scale = mxfp4.quantize(torch.randn(N, K, generator=gen) * 0.05)
    fast, reference = linear("triton", packed, scale, row_copy), linear("torch", packed, scale)
    act = lambda gate_up: torch.nn.functional.gelu(gate_up[:, :K], approximate="tanh") * gate_up[:, K:]  # noqa: E731
    with built_for("triton"):
        linked_act = GeluTanhAndMul(K)
    link_feed(linked_act, fast)  # as the model links its MLP: the gated paths take [gate | up]
    gate_up_all = torch.randn(MAX_ROWS, 2 * K, generator=gen).to("cuda", torch.bfloat16)
    wrong = [m for m in range(1, MAX_ROWS + 1)
             if not close(fast(linked_act(gate_up_all[:m])), reference(act(gate_up_all[:m])))]
    assert not wrong, (f"row counts off the reference: {wrong[:20]}; " + error_at(
        lambda x: fast(linked_act(x)), lambda x: reference(act(x)), gate_up_all, wrong[0]))


def test_moe_experts_take_every_token_count():
    tensors = per_expert_tensors(seed=2, hidden=256, inter=128)
    fast, reference = bf16_experts(tensors, "triton"), bf16_experts(tensors, "torch")
    gen = torch.Generator().manual_seed(3)
    x_all = torch.randn(MAX_ROWS, 256, generator=gen).to("cuda", torch.bfloat16)
    ids_all = torch.stack([torch.randperm(EXPERTS, generator=gen)[:2] for _ in range(MAX_ROWS)]).cuda()
    weights_all = torch.rand(MAX_ROWS, 2, generator=gen).cuda()
    wrong = []
    for m in range(1, MAX_ROWS + 1):
        args = (x_all[:m], weights_all[:m], ids_all[:m])
        if not close(fast(*args), reference(*args)):
            wrong.append(m)
    if wrong:
        m = wrong[0]
        got, want = fast(x_all[:m], weights_all[:m], ids_all[:m]), reference(x_all[:m], weights_all[:m], ids_all[:m])
        pytest.fail(f"token counts off the reference: {wrong[:20]}; at {m}: {relative(got, want):.3g}")
