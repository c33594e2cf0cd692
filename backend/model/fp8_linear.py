"""A linear layer whose weight stays FP8 (e4m3 with 128x128 ``weight_scale_inv`` blocks).

About one byte per weight on every device. On CUDA it calls the block-scaled Triton GEMM; on the
CPU it dequantizes a band of rows at a time inside the forward (``fp8_gemm.linear_tiled``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from backend.kernels import fp8_gemm, support
from backend.model import fp8

# Rows from which the GPU quantizes activations (W8A8, FP8 tensor cores) rather than converting
# weight tiles to bf16 (weight-only): decode is bandwidth-bound and reads the same weight bytes
# either way, so it skips the extra quantize launch; prefill is compute-bound and gains the FP8
# rate. A starting point until the H200 figures of benchmarks/kernels.py say otherwise.
W8A8_MIN_ROWS = 64


class FP8Linear(nn.Module):
    """y = x @ dequant(weight)^T; weight [out, in] e4m3, weight_scale_inv fp32 block grid."""

    weight_scale_inv: Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        compute_dtype: torch.dtype,
        block: tuple[int, int] = fp8.DEFAULT_BLOCK,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.compute_dtype = compute_dtype
        self.block = block
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=fp8.FP8_DTYPE), requires_grad=False
        )
        grid = fp8.scale_shape((out_features, in_features), block)
        self.register_buffer("weight_scale_inv", torch.empty(grid, dtype=torch.float32))

    def forward(self, x: Tensor) -> Tensor:  # x: [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features)
        if support.use_kernels(rows):
            out = fp8_gemm.fp8_linear(
                rows.contiguous(),
                self.weight,
                self.weight_scale_inv,
                quantize_activations=rows.shape[0] >= W8A8_MIN_ROWS,
                block=self.block,
            )
        else:
            out = fp8_gemm.linear_tiled(rows, self.weight, self.weight_scale_inv, self.block)
        return out.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> Tensor:
        """The whole weight [out, in] in the compute dtype (a temporary copy)."""
        return fp8.dequantize(self.weight, self.weight_scale_inv, self.block, self.compute_dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 {self.block}"


def dense_weight(linear: nn.Module) -> Tensor:
    """A linear's weight as a dense tensor: the parameter itself, or an FP8 one dequantized."""
    if isinstance(linear, FP8Linear):
        return linear.dequantized()
    weight = linear.weight
    assert isinstance(weight, Tensor)
    return weight


def make_resident(model: nn.Module, names: set[str], block: tuple[int, int]) -> int:
    """Replace each ``nn.Linear`` whose ``NAME.weight`` is in ``names`` by an FP8Linear of the
    same shape (on the same device, meta included). Returns how many were replaced."""
    replaced = 0
    for module_name, module in list(model.named_modules()):
        if f"{module_name}.weight" not in names or not isinstance(module, nn.Linear):
            continue
        if module.bias is not None:
            raise ValueError(f"{module_name}: FP8 linears with a bias are not supported")
        device = module.weight.device
        with torch.device(device):
            resident = FP8Linear(
                module.in_features, module.out_features, module.weight.dtype, block
            )
        parent_name, _, child = module_name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, resident)
        replaced += 1
    return replaced
