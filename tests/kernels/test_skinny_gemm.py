"""The skinny decode GEMM against an fp32 reference (interpreter on CPU, compiled on a GPU): every row count up to
16, with and without K splits, and the shapes it hands to torch's GEMM instead."""
import pytest
import torch

from helpers import assert_same_rounded_sum

from atomlite.model_ops.platform import parse_platform
from atomlite.model_ops.triton.common import num_sms, recording
from atomlite.model_ops.carriers import PartialSums, summed
from atomlite.model_ops.triton.gemm.skinny import (DEFAULT_CONFIG, NARROW_K_CONFIG, WIDE_N_CONFIG, SkinnyConfig,
                                                   config_for, fits, linear, num_splits, skinny_gemm)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = SkinnyConfig(32, 64, 4, 2, programs_per_sm=1)


def rel_err(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    ref = x.float() @ w.float().T
    return ((y.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("n,k", [(64, 256), (96, 1024)])
def test_skinny_gemm_matches_fp32_reference(rows, n, k):
    g = torch.Generator().manual_seed(rows * n + k)
    x = torch.randn(rows, k, generator=g).to(DEVICE, torch.bfloat16)
    w = torch.randn(n, k, generator=g).to(DEVICE, torch.bfloat16)
    y = skinny_gemm(x, w, SMALL)
    assert y.shape == (rows, n) and y.dtype == torch.bfloat16
    assert rel_err(y, x, w) < 1e-2  # bf16 output rounding (the interpreter truncates)


def test_split_k_slices_cover_k_exactly_once():
    """14 K tiles in 3 splits (5, 5, 4 tiles): every tile summed once."""
    config = SkinnyConfig(32, 64, 4, 2, programs_per_sm=3, min_k_tiles=4)
    assert num_splits(32, 14 * 64, torch.device(DEVICE), config) == 3
    x = torch.randn(2, 14 * 64).to(DEVICE, torch.bfloat16)
    w = torch.randn(32, 14 * 64).to(DEVICE, torch.bfloat16)
    assert rel_err(skinny_gemm(x, w, config), x, w) < 1e-2


def test_more_rows_or_unaligned_shapes_go_to_torch():
    w = torch.randn(64, 256, dtype=torch.bfloat16)
    assert fits(torch.randn(16, 256, dtype=torch.bfloat16), w)
    assert not fits(torch.randn(17, 256, dtype=torch.bfloat16), w)
    assert not fits(torch.randn(1, 200, dtype=torch.bfloat16), torch.randn(64, 200, dtype=torch.bfloat16))
    assert not fits(torch.randn(1, 256), torch.randn(64, 256))  # fp32 stays exact in torch
    x = torch.randn(40, 256, dtype=torch.bfloat16)
    assert torch.equal(linear(x, w), torch.nn.functional.linear(x, w))


def test_k_a_multiple_of_64_alone_takes_64_wide_k_tiles():
    """Gemma-4-26B-A4B's MLP down reads K = 2112 = 33 x 64: the skinny kernel, not torch's GEMM."""
    device = torch.device(DEVICE)
    assert config_for(128, 2112, device) == NARROW_K_CONFIG and config_for(128, 2816, device) == DEFAULT_CONFIG
    x = torch.randn(1, 2112).to(DEVICE, torch.bfloat16)
    w = torch.randn(128, 2112).to(DEVICE, torch.bfloat16)
    assert fits(x, w, NARROW_K_CONFIG) and not fits(x, w)
    unsummed = linear(x, w, summed=False)
    assert isinstance(unsummed, PartialSums)  # split over K, as torch's GEMM would not be
    assert rel_err(summed(unsummed), x, w) < 1e-2


def test_n_tiles_from_two_to_three_a_multiprocessor_take_three_stages():
    device = torch.device(DEVICE)
    sms, block_n = num_sms(device), DEFAULT_CONFIG.block_n
    assert config_for(2 * sms * block_n, 128, device) == DEFAULT_CONFIG
    assert config_for((2 * sms + 1) * block_n, 128, device) == WIDE_N_CONFIG
    assert config_for(3 * sms * block_n, 128, device) == WIDE_N_CONFIG
    assert config_for((3 * sms + 1) * block_n, 128, device) == DEFAULT_CONFIG
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 128, generator=g).to(DEVICE, torch.bfloat16)
    w = torch.randn((2 * sms + 1) * block_n, 128, generator=g).to(DEVICE, torch.bfloat16)
    assert rel_err(linear(x, w), x, w) < 1e-2


def test_unsummed_output_is_the_split_k_slices_that_add_up_to_the_summed_one():
    config = SkinnyConfig(32, 64, 4, 2, programs_per_sm=3, min_k_tiles=4)
    x = torch.randn(2, 14 * 64).to(DEVICE, torch.bfloat16)
    w = torch.randn(32, 14 * 64).to(DEVICE, torch.bfloat16)
    unsummed = skinny_gemm(x, w, config, summed=False)
    assert isinstance(unsummed, PartialSums) and unsummed.parts.shape == (3, 2, 32) and unsummed.shape == (2, 32)
    assert_same_rounded_sum(summed(unsummed), skinny_gemm(x, w, config))
    one_split = SkinnyConfig(32, 64, 4, 2, programs_per_sm=1, min_k_tiles=64)
    assert isinstance(skinny_gemm(x, w, one_split, summed=False), torch.Tensor)  # nothing to add: the output



@pytest.mark.parametrize("setting,dependent", [(None, True), ("0", False)])
def test_dependent_launch_on_sm90_unless_turned_off(setting, dependent, monkeypatch):
    """As launched for an H100 (recorded, not run): a dependent launch that waits in the kernel, or with
    ATOMLITE_PDL=0 a plain one."""
    if setting is None:
        monkeypatch.delenv("ATOMLITE_PDL", raising=False)
    else:
        monkeypatch.setenv("ATOMLITE_PDL", setting)
    x = torch.empty(1, 256, dtype=torch.bfloat16, device="meta")
    w = torch.empty(64, 256, dtype=torch.bfloat16, device="meta")
    with recording(parse_platform("sm_90")) as launches:
        skinny_gemm(x, w, SMALL)
    [launch] = launches
    assert launch.kwargs["PDL"] is dependent
    assert launch.kwargs.get("launch_pdl", False) is dependent
