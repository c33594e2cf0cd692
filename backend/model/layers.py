"""Small building blocks shared by the attention and FFN modules: RMSNorm and a SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backend.native import ops


class Linear(nn.Linear):
    """nn.Linear whose few-row CPU case (a decode step and its draft tokens) runs as a
    matrix-vector product.

    A decode step multiplies one token's row by every weight. On CPU the C kernel
    (``backend.native``, fp32 or bf16, one to four rows) reads the weight once at close to memory
    bandwidth and costs a few microseconds a call, where oneDNN's bf16 matmul costs about 30 us
    on small weights. Without the kernel: ``torch.mv`` for one fp32 row, weight @ x^T for two to
    four (it reads the weight once, where the general matmul is up to twice as slow), and the
    general matmul otherwise.
    """

    def forward(self, x: Tensor) -> Tensor:
        if self.bias is None and x.dim() == 2 and x.shape[0] <= ops.MAX_ROWS:
            out = ops.gemv(x, self.weight)
            if out is not None:
                return out
            if x.dtype == torch.float32:
                if x.shape[0] == 1:
                    return torch.mv(self.weight, x[0])[None]
                if x.device.type == "cpu":
                    return torch.mm(self.weight, x.T).T
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and returned in the input dtype (a few rows on CPU
    go through the C kernel, the same arithmetic)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2 and x.shape[0] <= ops.MAX_ROWS:
            out = ops.rms_norm(x, self.weight, self.eps)
            if out is not None:
                return out
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
