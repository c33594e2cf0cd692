"""Block-scaled FP8 linears: y = x @ dequant(W)^T with W e4m3 [N, K] and 128x128 scales.

Two kernels: weight-only (x stays bf16, each weight tile is converted in registers) and W8A8
(x quantized per token and per group of 128 columns, as DeepSeek's reference does, then an
e4m3 x e4m3 dot on tensor cores). The torch functions here are the CPU path and the oracle:
``linear_tiled`` dequantizes a band of rows at a time, so memory stays about one byte per weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from backend.kernels import support
from backend.model import fp8

GROUP = 128  # activation quantization group along K (one weight scale block)
_TILE_ELEMENTS = 1 << 22  # at most this many weights dequantized at once on the torch path


@dataclass(frozen=True)
class GemmTiles:
    """Tile sizes of one launch; BLOCK_K divides the scale block along K."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def choose_tiles(m: int) -> GemmTiles:
    """Decode (few rows) streams weights with narrow N tiles for many programs; prefill uses
    square tiles that reuse each weight tile across 128 rows."""
    if m <= 16:
        return GemmTiles(16, 64, 128, 4, 4)
    if m <= 64:
        return GemmTiles(64, 64, 128, 4, 3)
    return GemmTiles(128, 128, 128, 8, 3)


# --- torch references (the CPU path) -------------------------------------------------------


def act_quant_reference(x: Tensor, group: int = GROUP) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (e4m3 [M, K], fp32 scales [M, ceil(K / group)]), scale = amax / 448."""
    m, k = x.shape
    groups = -(-k // group)
    padded = x.new_zeros(m, groups * group, dtype=torch.float32)
    padded[:, :k] = x.float()
    blocks = padded.view(m, groups, group)
    scale = blocks.abs().amax(dim=-1).clamp(min=1e-12) / fp8.FP8_MAX
    q = (blocks / scale[..., None]).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).view(m, -1)[:, :k]
    return q.to(fp8.FP8_DTYPE), scale


def act_dequant_reference(q: Tensor, scale: Tensor, group: int = GROUP) -> Tensor:
    """Inverse of ``act_quant_reference`` in fp32."""
    per_column = scale.repeat_interleave(group, dim=1)[:, : q.shape[1]]
    return q.float() * per_column


def linear_tiled(
    x: Tensor,
    weight: Tensor,
    scale_inv: Tensor,
    block: tuple[int, int] = fp8.DEFAULT_BLOCK,
    tile_elements: int = _TILE_ELEMENTS,
) -> Tensor:
    """x [M, K] @ dequant(weight [N, K])^T -> [M, N] in x's dtype, dequantizing bands of rows
    (a whole number of scale blocks, about ``tile_elements`` weights) one after another."""
    n, k = weight.shape
    rows = max(block[0], tile_elements // max(k, 1) // block[0] * block[0])
    out = x.new_empty(x.shape[0], n)
    single_row = x.shape[0] == 1
    values = fp8_values(weight.device)
    for start in range(0, n, rows):
        end = min(n, start + rows)
        scales = scale_inv[start // block[0] : -(-end // block[0])]
        band = _dequantize_band(weight[start:end], scales, block, x.dtype, values)
        if single_row:
            torch.mv(band, x[0], out=out[0, start:end])
        else:
            torch.matmul(x, band.t(), out=out[:, start:end])
    return out


def fp8_values(device: torch.device) -> Tensor:
    """[256] fp32: the value of each e4m3 bit pattern."""
    patterns = torch.arange(256, dtype=torch.uint8, device=device)
    return patterns.view(fp8.FP8_DTYPE).float()


def _dequantize_band(
    weight: Tensor, scales: Tensor, block: tuple[int, int], dtype: torch.dtype, values: Tensor
) -> Tensor:
    """``fp8.dequantize`` of a band of rows; whole blocks decode e4m3 by table lookup (exact,
    about 2.4x faster than the dtype conversion on CPU) and scale by broadcasting."""
    rows, cols = weight.shape
    if rows % block[0] or cols % block[1]:
        return fp8.dequantize(weight, scales, block, dtype=dtype)
    grid = (rows // block[0], block[0], cols // block[1], block[1])
    decoded = values[weight.view(torch.uint8).long()].view(grid)
    out = torch.empty(grid, dtype=dtype, device=weight.device)
    torch.mul(decoded, scales[:, None, :, None], out=out)
    return out.view(rows, cols)


def w8a8_reference(
    x: Tensor, weight: Tensor, scale_inv: Tensor, block: tuple[int, int] = fp8.DEFAULT_BLOCK
) -> Tensor:
    """What the W8A8 kernel computes: x quantized per token-group, both sides dequantized, fp32."""
    q, scale = act_quant_reference(x, block[1])
    dense = fp8.dequantize(weight, scale_inv, block, dtype=torch.float32)
    return (act_dequant_reference(q, scale, block[1]) @ dense.t()).to(x.dtype)


# --- wrappers -------------------------------------------------------------------------------


def _check_weight(x: Tensor, weight: Tensor, scale_inv: Tensor, block: tuple[int, int]) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be [M, K], got shape {tuple(x.shape)}")
    if weight.dtype != fp8.FP8_DTYPE or weight.dim() != 2:
        raise ValueError(
            f"weight must be a 2-D {fp8.FP8_DTYPE}, got {weight.dtype} {weight.dim()}-D"
        )
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"x has {x.shape[1]} columns, weight has {weight.shape[1]}")
    expected = fp8.scale_shape((int(weight.shape[0]), int(weight.shape[1])), block)
    if tuple(scale_inv.shape) != expected or scale_inv.dtype != torch.float32:
        raise ValueError(
            f"scale_inv must be fp32 {expected}, got {scale_inv.dtype} {tuple(scale_inv.shape)}"
        )
    for name, tensor in (("x", x), ("weight", weight), ("scale_inv", scale_inv)):
        support.check_contiguous_rows(name, tensor)


def act_quant(x: Tensor, group: int = GROUP) -> tuple[Tensor, Tensor]:
    """Triton: x [M, K] -> (e4m3 [M, K], fp32 scales [M, ceil(K / group)])."""
    support.check_device(x)
    from backend.kernels import _fp8_gemm_triton as kernels

    if x.dim() != 2:
        raise ValueError(f"x must be [M, K], got shape {tuple(x.shape)}")
    support.check_contiguous_rows("x", x)
    m, k = x.shape
    q = torch.empty(m, k, dtype=fp8.FP8_DTYPE, device=x.device)
    scale = torch.empty(m, -(-k // group), dtype=torch.float32, device=x.device)
    kernels.act_quant_kernel[(m, scale.shape[1])](
        x, q, scale, k, x.stride(0), q.stride(0), scale.stride(0), GROUP=group, FP8_MAX=fp8.FP8_MAX
    )
    return q, scale


def fp8_linear(
    x: Tensor,
    weight: Tensor,
    scale_inv: Tensor,
    *,
    quantize_activations: bool,
    block: tuple[int, int] = fp8.DEFAULT_BLOCK,
    tiles: GemmTiles | None = None,
) -> Tensor:
    """Triton: x [M, K] @ dequant(weight [N, K])^T -> [M, N] in x's dtype.

    ``quantize_activations`` picks W8A8 (x quantized per token and group of ``block[1]``) over
    weight-only (x used as it is).
    """
    support.check_device(x, weight, scale_inv)
    from backend.kernels import _fp8_gemm_triton as kernels

    _check_weight(x, weight, scale_inv, block)
    m, k = x.shape
    n = weight.shape[0]
    tiles = tiles or choose_tiles(m)
    if block[1] % tiles.block_k:
        raise ValueError(f"block_k {tiles.block_k} must divide the scale block {block[1]}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if quantize_activations:
        a, a_scale = act_quant(x, block[1])
    else:
        a, a_scale = x, scale_inv  # a_scale unused when ACT_SCALED is false
    grid = kernels.grid_2d(m, n, tiles.block_m, tiles.block_n)
    kernels.fp8_gemm_kernel[grid](
        a, a_scale, weight, scale_inv, out, m, n, k,
        a.stride(0), a_scale.stride(0), weight.stride(0), scale_inv.stride(0), out.stride(0),
        ACT_SCALED=quantize_activations, UPCAST=support.upcast_loads(x),
        SCALE_N=block[0], SCALE_K=block[1],
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out
