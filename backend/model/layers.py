"""Small building blocks shared by the attention and FFN modules: RMSNorm and a SwiGLU MLP
(on a GPU through the fused small kernels of ``backend.kernels.small_ops``)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backend.kernels import small_ops, support
from backend.native import ops


@functools.cache
def cpu_gemm_reads_once() -> bool:
    """Whether this CPU's general matmul (MKL) multiplies a few fp32 rows by a weight as fast as
    one row: true on Intel CPUs, where it reads the weight once for 2 to 4 rows (1.7 ms for 1 or
    2 rows of a 8192 x 1024 weight, one thread) and beats ``torch.mv`` on small weights (5 vs 9
    us on 160 x 64). Read once from /proc/cpuinfo; False where it is not readable."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return "GenuineIntel" in info


def linear_rows(x: Tensor, weight: Tensor) -> Tensor:
    """x [N, in] @ weight [out, in]^T -> [N, out], by the fastest CPU form for small N.

    A decode step multiplies one token's row by every weight, a verifying step one to four rows
    (a decode and its drafts). On Intel CPUs the general matmul is fastest for all of them. Else
    (measured on an AMD EPYC, one thread) ``torch.mv`` reads an fp32 weight at least as fast as
    the matmul for one row, and weight @ x^T reads it once for two to four rows, about as fast as
    one, where the general matmul is up to twice as slow (not so from 8 rows). bf16 weights take
    the matmul (oneDNN reads them up to 1.8x faster than ``torch.mv``).
    """
    if x.dtype == torch.float32 and x.device.type == "cpu" and not cpu_gemm_reads_once():
        if x.shape[0] == 1:
            return torch.mv(weight, x[0])[None]
        if x.shape[0] <= 4:
            return torch.mm(weight, x.T).T
    return F.linear(x, weight)


class Linear(nn.Linear):
    """nn.Linear whose few-row bias-free CPU case (a decode step and its draft tokens) runs as a
    matrix-vector product: the C kernel (``backend.native``, fp32 or bf16, one to four rows) reads
    the weight once at close to memory bandwidth for a few microseconds a call, where oneDNN's
    bf16 matmul costs about 30 us on small weights; without it, ``linear_rows``."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2 and self.bias is None:
            return project_rows(x, self.weight)
        return F.linear(x, self.weight, self.bias)


def project_rows(x: Tensor, weight: Tensor) -> Tensor:
    """x [N, in] @ weight [out, in]^T: the C kernel for a few rows where it is built and
    applies, else ``linear_rows``."""
    if x.shape[0] <= ops.MAX_ROWS:
        out = ops.gemv(x, weight)
        if out is not None:
            return out
    return linear_rows(x, weight)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and returned in the input dtype (a few rows on CPU
    go through the C kernel, the same arithmetic)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        if _fused(x, self.weight):
            return small_ops.add_rms_norm(x, self.weight, self.eps)[0]
        if x.dim() == 2 and x.shape[0] <= ops.MAX_ROWS:
            out = ops.rms_norm(x, self.weight, self.eps)
            if out is not None:
                return out
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)

    def add_forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(norm(x + residual), x + residual): one fused kernel on a GPU."""
        if _fused(x, self.weight) and _fused(residual, self.weight):
            return small_ops.add_rms_norm(x, self.weight, self.eps, residual)
        h = x + residual
        return self(h), h


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): the dense FFN, each routed expert and the shared experts."""

    def __init__(self, dim: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_proj = Linear(dim, hidden, bias=False, dtype=dtype)
        self.up_proj = Linear(dim, hidden, bias=False, dtype=dtype)
        self.down_proj = Linear(hidden, dim, bias=False, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:  # x: [T, dim] -> [T, dim]
        gate, up = self.gate_proj(x), self.up_proj(x)
        if _fused(gate, up) and gate.shape == up.shape:
            return self.down_proj(small_ops.silu_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)


def _fused(x: Tensor, other: Tensor) -> bool:
    """Whether the fused small kernels take these tensors: CUDA with Triton, rows of unit
    stride, one dtype (elsewhere the torch path, the kernels' reference, runs)."""
    return (
        support.use_kernels(x)
        and x.dim() == 2
        and x.shape[-1] <= small_ops.MAX_NORM_WIDTH
        and x.stride(-1) == 1
        and other.stride(-1) == 1
        and x.dtype == other.dtype
    )
