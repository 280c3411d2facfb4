"""MXFP4 reference in plain torch: e2m1 elements in blocks of 32 along K, one e8m0 scale byte per block.

Bit-compatible with amd-quark 0.13 ("even" scale rounding, half-even element rounding) and with the packed layout of
its checkpoints: byte[n, j] = code[n, 2j] | code[n, 2j + 1] << 4, value = E2M1[code] * 2^(scale - 127).
"""
import torch

BLOCK = 32
E2M1_MAX = 6.0
E8M0_BIAS = 127

# Magnitude of each 3-bit code; bit 3 of a nibble is the sign.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# Midpoints between neighbouring magnitudes. At a tie half-even picks the code whose mantissa bit is 0: the even
# codes 0, 2, 4, 6, so the magnitude rises past a midpoint only when strictly above it, or exactly on it when the
# upper neighbour is the even code.
_MIDPOINTS_ROUND_UP_ON_TIE = (
    (0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [..., ceil(K/32), 32]: a partial last block is padded with zeros, as Quark pads it."""
    x = torch.nn.functional.pad(x, (0, -x.shape[-1] % BLOCK))
    return x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def _unblocked(blocks: torch.Tensor, k: int) -> torch.Tensor:
    """_blocks undone: [..., G, 32] -> [..., k]."""
    return blocks.reshape(*blocks.shape[:-2], -1)[..., :k]


def e8m0_exponents(amax: torch.Tensor) -> torch.Tensor:
    """Shared exponent E per block (int32, in [-127, 127]) so that amax / 2^E fits e2m1 ("even" rounding).

    amax is rounded to a power of two by adding half an e2m1 mantissa step to its float bits and dropping the
    mantissa (1.75 * 2^n and above go up to 2^(n+1)); then 2 is taken off for e2m1's largest exponent.
    """
    bits = amax.to(torch.float32).contiguous().view(torch.int32)
    rounded_exponent = ((bits + 0x200000) >> 23) & 0xFF
    return (rounded_exponent - E8M0_BIAS - 2).clamp(-E8M0_BIAS, E8M0_BIAS)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    return torch.exp2(scale.to(torch.float32) - E8M0_BIAS)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (uint8, 0..15) for each value already divided by its block scale; saturates at +-6."""
    magnitude = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for midpoint, up_on_tie in _MIDPOINTS_ROUND_UP_ON_TIE:
        code += (magnitude >= midpoint if up_on_tie else magnitude > midpoint).to(torch.uint8)
    # Values that round to zero get +0 (code 0), as Quark writes them, whatever their sign.
    return code | (((x < 0) & (code > 0)).to(torch.uint8) << 3)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES), device=code.device)
    return table[code.long()]


def pack_e2m1(code: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes, the even (first) element in the low nibble."""
    pairs = code.reshape(*code.shape[:-1], code.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _codes_and_exponents(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = _blocks(x.to(torch.float32))
    exponent = e8m0_exponents(blocks.abs().amax(dim=-1))
    scaled = blocks / torch.exp2(exponent.to(torch.float32))[..., None]
    return _unblocked(e2m1_encode(scaled.clamp(-E2M1_MAX, E2M1_MAX)), x.shape[-1]), exponent


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] (K even) -> (packed uint8 [..., K/2], e8m0 scale uint8 [..., ceil(K/32)]), per 32 along the last
    dimension (a partial last block quantized as if padded with zeros)."""
    code, exponent = _codes_and_exponents(x)
    # Quark's exporter clamps the stored scale to the smallest normal float, 2^-126 (byte 1): all-zero blocks and
    # blocks under ~2^-124 are written with byte 1 although they were quantized with 2^-127.
    return pack_e2m1(code), (exponent + E8M0_BIAS).clamp(min=1).to(torch.uint8)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(packed [..., K/2], scale [..., ceil(K/32)]) -> values [..., K] in dtype."""
    values = _blocks(e2m1_decode(unpack_e2m1(packed)))
    return _unblocked(values * e8m0_to_float(scale)[..., None], packed.shape[-1] * 2).to(dtype)


def quantize_dequantize(x: torch.Tensor) -> torch.Tensor:
    """What dynamic MXFP4 activation quantization makes of x, in x's dtype."""
    code, exponent = _codes_and_exponents(x)
    values = _blocks(e2m1_decode(code)) * torch.exp2(exponent.to(torch.float32))[..., None]
    return _unblocked(values, x.shape[-1]).to(x.dtype)


def pad_k(weight: torch.Tensor, scale: torch.Tensor, k_align: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed weight [N, K/2] and scales [N, ceil(K/32)] -> K padded to a multiple of k_align with zero codes under
    unit scales (byte 127, 2^0), contiguous: the padded elements are exact zeros for every kernel."""
    k_padded = -(-weight.shape[1] * 2 // k_align) * k_align
    weight = torch.nn.functional.pad(weight, (0, k_padded // 2 - weight.shape[1]))
    scale = torch.nn.functional.pad(scale, (0, k_padded // BLOCK - scale.shape[1]), value=E8M0_BIAS)
    return weight.contiguous(), scale.contiguous()
