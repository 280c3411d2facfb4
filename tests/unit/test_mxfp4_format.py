"""The MXFP4 reference against the worked example of shared/docs/QUARK_MXFP4.md and the format's invariants.
(Comparison with amd-quark's own functions: test_quark_reference.py.)"""
import torch

from atomlite.quant import mxfp4


def worked_example_block() -> torch.Tensor:
    block = torch.full((1, 32), 0.25)
    block[0, :4] = torch.tensor([0.75, -1.5, 3.0, 0.1])
    return block


def test_worked_example_round_trips_bit_exactly():
    packed, scale = mxfp4.quantize(worked_example_block())
    assert scale.tolist() == [[126]]
    assert packed.tolist() == [[0xD3, 0x07] + [0x11] * 14]
    assert mxfp4.unpack_e2m1(packed)[0, :4].tolist() == [0x3, 0xD, 0x7, 0x0]
    expected = worked_example_block()
    expected[0, 3] = 0.0  # 0.1 / 0.5 = 0.2 is nearer 0 than 0.5
    assert torch.equal(mxfp4.dequantize(packed, scale), expected)


def test_low_nibble_holds_the_even_element():
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x8]], dtype=torch.uint8)
    assert mxfp4.pack_e2m1(codes).tolist() == [[0x21, 0x8F]]
    assert torch.equal(mxfp4.unpack_e2m1(mxfp4.pack_e2m1(codes)), codes)


def test_every_byte_unpacks_and_repacks_to_itself():
    every_byte = torch.arange(256, dtype=torch.uint8).reshape(8, 32)
    assert torch.equal(mxfp4.pack_e2m1(mxfp4.unpack_e2m1(every_byte)), every_byte)


def test_ties_round_to_the_even_code_and_large_values_saturate():
    halfway = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.75, -5.0, -0.2])
    assert mxfp4.e2m1_decode(mxfp4.e2m1_encode(halfway)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0,
                                                                       -1.0, -4.0, 0.0]


def test_scale_rounds_amax_up_to_a_power_of_two_from_1_75():
    # amax 1.74 * 2^3 keeps 2^3 (E = 1); 1.75 * 2^3 goes to 2^4 (E = 2); an all-zero block gets Quark's byte 1.
    amax = torch.tensor([1.74 * 8, 1.75 * 8, 0.0])
    assert mxfp4.e8m0_exponents(amax).tolist() == [1, 2, -127]
    block = torch.zeros(1, 32)
    assert mxfp4.quantize(block)[1].tolist() == [[1]]


def test_quantize_dequantize_is_idempotent_and_close():
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(0))
    once = mxfp4.quantize_dequantize(x)
    assert torch.equal(mxfp4.quantize_dequantize(once), once)
    assert (once - x).norm() / x.norm() < 0.15
    assert torch.equal(mxfp4.dequantize(*mxfp4.quantize(x)), once)
