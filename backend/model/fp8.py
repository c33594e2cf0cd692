"""Block-scaled FP8 (e4m3) weights as DeepSeek ships them.

W[i, j] = W_fp8[i, j] * scale_inv[i // block_rows, j // block_cols]; a dimension that is not a
multiple of the block uses a partial last block.
"""

from __future__ import annotations

import torch
from torch import Tensor

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
DEFAULT_BLOCK = (128, 128)


def is_fp8_linear(name: str) -> bool:
    """Whether DeepSeek ships tensor ``name`` in FP8: the linear weights inside the layers
    (attention, dense FFN, experts, MTP's eh_proj); embeddings, heads, norms and routers stay
    in the checkpoint's dtype."""
    if not name.startswith("model.layers.") or ".shared_head." in name:
        return False
    return name.endswith(("_proj.weight", "_proj_with_mqa.weight"))


def scale_shape(shape: tuple[int, ...], block: tuple[int, int] = DEFAULT_BLOCK) -> tuple[int, int]:
    """Shape of the scale_inv grid covering a 2-D weight of ``shape``."""
    rows, cols = shape
    return -(-rows // block[0]), -(-cols // block[1])


def _expand(scale_inv: Tensor, shape: tuple[int, int], block: tuple[int, int]) -> Tensor:
    """[rows, cols] per-element scale from the per-block grid (partial edge blocks cropped)."""
    rows, cols = shape
    per_row = scale_inv.repeat_interleave(block[0], dim=0)[:rows]
    return per_row.repeat_interleave(block[1], dim=1)[:, :cols]


def dequantize(
    weight: Tensor,
    scale_inv: Tensor,
    block: tuple[int, int] = DEFAULT_BLOCK,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """weight [R, C] fp8, scale_inv [ceil(R/b0), ceil(C/b1)] fp32 -> [R, C] in ``dtype``."""
    shape = (int(weight.shape[0]), int(weight.shape[1]))
    expected = scale_shape(shape, block)
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"scale_inv shape {tuple(scale_inv.shape)}, expected {expected}")
    scales = _expand(scale_inv.float(), shape, block)
    return (weight.float() * scales).to(dtype)


def quantize(
    weight: Tensor, block: tuple[int, int] = DEFAULT_BLOCK, *, power_of_two: bool = True
) -> tuple[Tensor, Tensor]:
    """weight [R, C] -> (fp8 [R, C], scale_inv fp32 grid) so that ``dequantize`` inverts it.

    ``power_of_two`` rounds each scale up to a power of two (the UE8M0 scales of V3.1).
    """
    rows, cols = int(weight.shape[0]), int(weight.shape[1])
    grid = scale_shape((rows, cols), block)
    padded = torch.zeros(grid[0] * block[0], grid[1] * block[1], dtype=torch.float32)
    padded[:rows, :cols] = weight.float()
    blocks = padded.view(grid[0], block[0], grid[1], block[1])
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale_inv = amax / FP8_MAX
    if power_of_two:
        scale_inv = torch.exp2(torch.ceil(torch.log2(scale_inv)))
    scaled = weight.float() / _expand(scale_inv, (rows, cols), block)
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale_inv
