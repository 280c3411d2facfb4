"""The MXFP4 linear's kernel family comes from dispatch (mxfp4_linear) and lays the weight out at load as its GEMMs
read it: the Triton family pads K and learns what the scales allow, AITER's re-lays the weight out for gemm_a4w4 and
drops the packed parameters, the reference keeps the checkpoint's bytes. No aiter import is needed to load."""
import torch

from atomlite.model_ops import dispatch
from atomlite.model_ops.aiter.mxfp4 import prepare_weight
from atomlite.model_ops.mxfp4_linear import MXFP4Linear
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.triton.mxfp4.family import ScaleFacts
from atomlite.model_ops.triton.mxfp4.gemm import K_ALIGN, needs_wide_scales
from atomlite.model_ops.triton.mxfp4.lookup import scale_bytes_fit
from atomlite.quant import mxfp4
from atomlite.quant.quark import LinearQuantSpec

N, K = 64, 96  # K not a multiple of the Triton family's K_ALIGN


def loaded(platform: Platform, prefer: str = "auto") -> tuple[MXFP4Linear, torch.Tensor, torch.Tensor]:
    packed, scale = mxfp4.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(0)))
    with dispatch.use(platform, prefer):
        layer = MXFP4Linear(K, N, LinearQuantSpec(dynamic_fp4_input=True))
    layer.weight.weight_loader(layer.weight, packed)
    layer.weight_scale.weight_loader(layer.weight_scale, scale)
    layer.process_after_loading()
    return layer, packed, scale


def test_triton_family_pads_k_and_learns_what_the_scales_allow():
    layer, packed, scale = loaded(Platform("cuda", "sm_90"))
    assert layer.backend == "triton" and layer.weight.shape == (N, K_ALIGN // 2)
    assert torch.equal(layer.weight[:, :K // 2], packed) and not layer.weight[:, K // 2:].any()
    assert layer.prepared == ScaleFacts(needs_wide_scales(layer.weight_scale),
                                        scale_bytes_fit(layer.weight, layer.weight_scale))


def test_aiter_family_keeps_only_the_weight_gemm_a4w4_reads():
    layer, packed, scale = loaded(Platform("rocm", "gfx950", has_aiter=True))
    want = prepare_weight(packed, scale)
    assert layer.backend == "aiter" and layer.weight.numel() == layer.weight_scale.numel() == 0
    assert torch.equal(layer.prepared.weight.view(torch.uint8), want.weight.view(torch.uint8))
    assert torch.equal(layer.prepared.scale.view(torch.uint8), want.scale.view(torch.uint8))


def test_reference_family_keeps_the_checkpoint_bytes_and_matches_the_dequantized_weight():
    layer, packed, scale = loaded(Platform("cpu"), "torch")
    assert torch.equal(layer.weight, packed) and layer.prepared is None
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(layer(x), mxfp4.quantize_dequantize(x) @ mxfp4.dequantize(packed, scale).T)
