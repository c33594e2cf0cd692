"""Small building blocks shared by the attention and FFN modules: RMSNorm and a SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Linear(nn.Linear):
    """nn.Linear whose single-row fp32 case runs as a matrix-vector product.

    A decode step multiplies one token's row by every weight. On CPU ``torch.mv`` reads an fp32
    weight at least as fast as the general matmul; for bf16 weights the matmul (oneDNN) reads
    them up to 1.8x faster than ``torch.mv`` (measured on the project's AMD EPYC, one thread).
    Two to four fp32 rows on CPU (a decode and its draft tokens) take weight @ x^T, which reads
    the weight once, about as fast as one row, where the general matmul is up to twice as slow
    (measured on a 129280 x 64 and an 8192 x 1024 weight; not so from 8 rows).
    """

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2 and self.bias is None and x.dtype == torch.float32:
            if x.shape[0] == 1:
                return torch.mv(self.weight, x[0])[None]
            if x.shape[0] <= 4 and x.device.type == "cpu":
                return torch.mm(self.weight, x.T).T
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and returned in the input dtype."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): the dense FFN, each routed expert and the shared experts."""

    def __init__(self, dim: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_proj = Linear(dim, hidden, bias=False, dtype=dtype)
        self.up_proj = Linear(dim, hidden, bias=False, dtype=dtype)
        self.down_proj = Linear(hidden, dim, bias=False, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:  # x: [T, dim] -> [T, dim]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
