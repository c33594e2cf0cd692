"""Triton kernels for the fused MoE (imported lazily by ``fused_moe``).

The (token, slot) pairs are grouped by expert and each expert's group padded to BLOCK_M rows;
``block_expert[b]`` names the expert of row block b (-1: an unused block). Both kernels are
grouped GEMMs over those blocks: the first computes silu(x W_gate^T) * (x W_up^T) from the
stacked [E, 2I, D] weight, the second the down projection [E, D, I] times the router weight.
FP8 weights carry one fp32 scale per 128x128 block and are converted tile by tile.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _expert_dot(
    a_ptr, a_rows, mask_m, stride_a, w_ptr, w_rows, mask_n, stride_w, s_ptr, s_rows, stride_s, K,
    FP8: tl.constexpr, UPCAST: tl.constexpr, SCALE_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """[BLOCK_M, BLOCK_N] fp32: rows ``a_rows`` of A times rows ``w_rows`` of one expert's W."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    offs_k = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        mask_k = ks < K
        a = tl.load(
            a_ptr + a_rows[:, None] * stride_a + ks[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + w_rows[None, :] * stride_w + ks[:, None],
            mask=mask_n[None, :] & mask_k[:, None],
            other=0.0,
        )  # [BLOCK_K, BLOCK_N]
        if UPCAST:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        else:
            w = w.to(a.dtype)
        partial = tl.dot(a, w, input_precision="ieee")
        if FP8:
            scale = tl.load(s_ptr + s_rows * stride_s + k0 // SCALE_K, mask=mask_n, other=0.0)
            partial = partial * scale[None, :]
        acc += partial
    return acc


@triton.jit
def gate_up_kernel(
    x_ptr, w_ptr, s_ptr, h_ptr, pair_ptr, block_expert_ptr,
    num_pairs, dim, inter, up_scale_row,
    stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_h,
    TOP_K: tl.constexpr, FP8: tl.constexpr, UPCAST: tl.constexpr,
    SCALE_N: tl.constexpr, SCALE_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """h[pair, n] = silu(x[token] . W_gate[e, n]) * (x[token] . W_up[e, n]) for n in one tile."""
    block = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    pairs = tl.load(pair_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    mask_m = pairs < num_pairs
    tokens = pairs // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < inter
    w_expert = w_ptr + expert.to(tl.int64) * stride_we
    s_expert = s_ptr + expert.to(tl.int64) * stride_se
    gate = _expert_dot(
        x_ptr, tokens, mask_m, stride_x, w_expert, offs_n, mask_n, stride_wn,
        s_expert, offs_n // SCALE_N, stride_sn, dim,
        FP8, UPCAST, SCALE_K, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    up = _expert_dot(
        x_ptr, tokens, mask_m, stride_x, w_expert, inter + offs_n, mask_n, stride_wn,
        s_expert, up_scale_row + offs_n // SCALE_N, stride_sn, dim,
        FP8, UPCAST, SCALE_K, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(
        h_ptr + pairs[:, None] * stride_h + offs_n[None, :],
        h.to(h_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_n[None, :],
    )


@triton.jit
def down_kernel(
    h_ptr, w_ptr, s_ptr, out_ptr, pair_ptr, block_expert_ptr, route_ptr,
    num_pairs, dim, inter,
    stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_out,
    FP8: tl.constexpr, UPCAST: tl.constexpr, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """out[pair, n] = route_weight[pair] * (h[pair] . W_down[e, n]) for n in one tile."""
    block = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    pairs = tl.load(pair_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    mask_m = pairs < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < dim
    acc = _expert_dot(
        h_ptr, pairs, mask_m, stride_h,
        w_ptr + expert.to(tl.int64) * stride_we, offs_n, mask_n, stride_wn,
        s_ptr + expert.to(tl.int64) * stride_se, offs_n // SCALE_N, stride_sn, inter,
        FP8, UPCAST, SCALE_K, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    route = tl.load(route_ptr + pairs, mask=mask_m, other=0.0)
    out = acc * route[:, None]
    tl.store(
        out_ptr + pairs[:, None] * stride_out + offs_n[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_n[None, :],
    )
