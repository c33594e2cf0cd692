"""Triton kernels for the step's small element-wise work (imported lazily by ``small_ops``):
RMSNorm fused with the residual add before it, and SiLU(gate) x up. One program per row; the
row is one tile of BLOCK_D (a power of two at least D) columns, computed in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def add_rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, D, eps,
    stride_x, stride_r, stride_y, stride_h,
    HAS_RESIDUAL: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """h = x + r (stored in h's dtype, as the unfused add rounds it), y = weight * (h / rms(h))
    with the normalized value rounded to y's dtype before the weight multiplies it."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        h = h + tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0)
        tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
    h32 = h.to(tl.float32)
    mean_square = tl.sum(h32 * h32, axis=0) / D
    normed = (h32 * tl.math.rsqrt(mean_square + eps)).to(y_ptr.dtype.element_ty)
    weight = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride_y + cols, weight * normed, mask=mask)


@triton.jit
def silu_mul_kernel(
    g_ptr, u_ptr, out_ptr, D, stride_g, stride_u, stride_out, BLOCK_D: tl.constexpr
):  # fmt: skip
    """out = silu(gate) * up: silu in fp32, rounded to out's dtype before the product (as
    ``F.silu(gate) * up`` rounds it)."""
    row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK_D
    cols = start + tl.arange(0, BLOCK_D)
    mask = cols < D
    gate = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0)
    activated = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, activated * up, mask=mask)


@triton.jit
def latent_write_kernel(
    kv_ptr, w_ptr, cos_ptr, sin_ptr, slot_ptr, cache_ptr, eps,
    stride_kv, stride_cos, stride_sin, stride_cache,
    LORA: tl.constexpr, HALF_ROPE: tl.constexpr,
    LORA_PAD: tl.constexpr, HALF_PAD: tl.constexpr,
):  # fmt: skip
    """One token's latent row into its cache slot: c_kv (the first LORA values of kv_a's
    output) RMS-normed by ``w``, then k_pe (the next 2 x HALF_ROPE) rotated pairwise by cos and
    sin, both rounded to the cache's dtype as the unfused norm and rotation round them."""
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    cols = tl.arange(0, LORA_PAD)
    mask = cols < LORA
    c_kv = tl.load(kv_ptr + row * stride_kv + cols, mask=mask, other=0.0).to(tl.float32)
    mean_square = tl.sum(c_kv * c_kv, axis=0) / LORA
    normed = (c_kv * tl.math.rsqrt(mean_square + eps)).to(cache_ptr.dtype.element_ty)
    weight = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = cache_ptr + slot * stride_cache
    tl.store(out + cols, weight * normed, mask=mask)
    pairs = tl.arange(0, HALF_PAD)
    in_rope = pairs < HALF_ROPE
    base = kv_ptr + row * stride_kv + LORA + 2 * pairs
    even = tl.load(base, mask=in_rope, other=0.0).to(tl.float32)
    odd = tl.load(base + 1, mask=in_rope, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + row * stride_cos + pairs, mask=in_rope, other=0.0)
    sin = tl.load(sin_ptr + row * stride_sin + pairs, mask=in_rope, other=0.0)
    dtype = cache_ptr.dtype.element_ty
    tl.store(out + LORA + 2 * pairs, (even * cos - odd * sin).to(dtype), mask=in_rope)
    tl.store(out + LORA + 2 * pairs + 1, (odd * cos + even * sin).to(dtype), mask=in_rope)
