"""Triton kernels for block-scaled FP8 linears (imported lazily by ``fp8_gemm``).

Weights are e4m3 [N, K] with one fp32 scale per (SCALE_N x SCALE_K) block. BLOCK_K divides
SCALE_K, so within one K tile every output column has a single weight scale: the tile's partial
product is scaled once per column after the dot, in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to_e4m3(x):
    """Round fp32 to the nearest e4m3 value (ties to even) in fp32 arithmetic, so the final
    conversion is exact everywhere (the interpreter's own rounding drops mantissa carries).
    Adding then subtracting 1.5 * 2^(23 + p) rounds to a multiple of 2^p: p is the exponent
    minus e4m3's 3 mantissa bits, floored at the subnormal step 2^-9."""
    exponent = tl.maximum(tl.floor(tl.log2(tl.maximum(tl.abs(x), 1e-30))), -6.0)
    magic = 1.5 * tl.exp2(exponent + 20.0)
    return (x + magic) - magic


@triton.jit
def act_quant_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm,
    GROUP: tl.constexpr, FP8_MAX: tl.constexpr,
):  # fmt: skip
    """One program per (row, group of GROUP columns): amax -> scale -> e4m3 values."""
    row = tl.program_id(0)
    group = tl.program_id(1)
    cols = group * GROUP + tl.arange(0, GROUP)
    mask = cols < K
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12)
    scale = amax / FP8_MAX
    q = round_to_e4m3(tl.clamp(x / scale, -FP8_MAX, FP8_MAX))
    tl.store(q_ptr + row * stride_qm + cols, q, mask=mask)
    tl.store(s_ptr + row * stride_sm + group, scale)


@triton.jit
def fp8_gemm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, c_ptr, M, N, K,
    stride_am, stride_asm, stride_wn, stride_wsn, stride_cm,
    ACT_SCALED: tl.constexpr, UPCAST: tl.constexpr,
    SCALE_N: tl.constexpr, SCALE_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """C[M, N] = A[M, K] @ dequant(W)[N, K]^T.

    ACT_SCALED: A is e4m3 with one scale per (row, SCALE_K group) in ``as_ptr`` (W8A8);
    otherwise A is bf16/fp16/fp32 and the weight tile is converted to A's dtype (weight-only).
    UPCAST converts both tiles to fp32 before the dot (the interpreter's path).
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        mask_k = ks < K
        a = tl.load(
            a_ptr + offs_m[:, None] * stride_am + ks[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + offs_n[None, :] * stride_wn + ks[:, None],
            mask=mask_n[None, :] & mask_k[:, None],
            other=0.0,
        )  # [BLOCK_K, BLOCK_N]
        w_scale = tl.load(
            ws_ptr + (offs_n // SCALE_N) * stride_wsn + k0 // SCALE_K, mask=mask_n, other=0.0
        )
        if UPCAST:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        elif not ACT_SCALED:
            w = w.to(a.dtype)
        partial = tl.dot(a, w, input_precision="ieee")
        if ACT_SCALED:
            a_scale = tl.load(as_ptr + offs_m * stride_asm + k0 // SCALE_K, mask=mask_m, other=0.0)
            partial = partial * a_scale[:, None]
        acc += partial * w_scale[None, :]
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(
        c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :],
        c,
        mask=mask_m[:, None] & mask_n[None, :],
    )


def grid_2d(m: int, n: int, block_m: int, block_n: int) -> tuple[int, int]:
    return triton.cdiv(m, block_m), triton.cdiv(n, block_n)
