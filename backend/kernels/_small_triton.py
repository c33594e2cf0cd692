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


@triton.jit
def route_kernel(
    logits_ptr, bias_ptr, w_ptr, id_ptr, stride_l, stride_w, stride_id, scaling,
    N_GROUP: tl.constexpr, PER_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
    TOP_K: tl.constexpr, TOP_K_PAD: tl.constexpr, GROUPED: tl.constexpr, NORM: tl.constexpr,
):  # fmt: skip
    """One token's noaux_tc routing: sigmoid scores, the bias added for the choice; with
    GROUPED, the TOPK_GROUP groups of highest top-2 sum kept; the TOP_K best experts of what is
    kept, ties to the lower index (the argmaxes break ties left); weights are the unbiased
    scores of those experts, normalized with NORM, times ``scaling``."""
    row = tl.program_id(0)
    groups = tl.arange(0, N_GROUP)
    members = tl.arange(0, PER_GROUP)
    offsets = groups[:, None] * PER_GROUP + members[None, :]
    logits = tl.load(logits_ptr + row * stride_l + offsets).to(tl.float32)
    scores = 1.0 / (1.0 + tl.exp(-logits))
    biased = scores + tl.load(bias_ptr + offsets).to(tl.float32)
    if GROUPED:
        first = tl.max(biased, axis=1)
        first_at = tl.argmax(biased, axis=1)
        second = tl.max(tl.where(members[None, :] == first_at[:, None], -float("inf"), biased), 1)
        group_scores = first + second
        kept = groups < 0
        for _ in tl.static_range(TOPK_GROUP):
            best = tl.argmax(tl.where(kept, -float("inf"), group_scores), axis=0)
            kept = kept | (groups == best)
        biased = tl.where(kept[:, None], biased, -float("inf"))
    slots = tl.arange(0, TOP_K_PAD)
    weights = tl.zeros([TOP_K_PAD], dtype=tl.float32)
    ids = tl.zeros([TOP_K_PAD], dtype=tl.int64)
    for k in tl.static_range(TOP_K):
        best_group = tl.argmax(tl.max(biased, axis=1), axis=0)
        in_group = tl.max(tl.where(groups[:, None] == best_group, biased, -float("inf")), axis=0)
        chosen = best_group * PER_GROUP + tl.argmax(in_group, axis=0)
        hit = offsets == chosen
        weights = tl.where(slots == k, tl.sum(tl.where(hit, scores, 0.0)), weights)
        ids = tl.where(slots == k, chosen.to(tl.int64), ids)
        biased = tl.where(hit, -float("inf"), biased)
    if NORM:
        weights = weights / (tl.sum(weights, axis=0) + 1e-20)
    valid = slots < TOP_K
    tl.store(w_ptr + row * stride_w + slots, weights * scaling, mask=valid)
    tl.store(id_ptr + row * stride_id + slots, ids, mask=valid)
