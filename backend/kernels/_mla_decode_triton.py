"""Triton kernel for weight-absorbed MLA decode over the paged latent cache (imported lazily by
``mla_decode``).

Each query token attends over the first ``token_len[t]`` latent rows of its sequence. A row is
[c_kv (LORA) | k_pe (ROPE)]: the key is the whole row and the value its first LORA values, so
one read of the cache serves both. The keys are cut into NUM_SPLITS ranges (flash decoding);
each program keeps an online softmax over its range for BLOCK_H heads of one token and writes
its partial output and log-sum-exp for the wrapper to combine.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mla_decode_kernel(
    q_ptr, qpe_ptr, kv_ptr, table_ptr, seq_ptr, len_ptr, out_ptr, lse_ptr,
    num_heads, scale,
    stride_qt, stride_qh, stride_pt, stride_ph, stride_kv, stride_table,
    stride_ot, stride_oh, stride_os, stride_lt, stride_lh,
    LORA: tl.constexpr, ROPE: tl.constexpr, LORA_PAD: tl.constexpr, ROPE_PAD: tl.constexpr,
    PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    head_block = tl.program_id(0)
    split = tl.program_id(1)
    token = tl.program_id(2)
    seq = tl.load(seq_ptr + token)
    length = tl.load(len_ptr + token)
    per_split = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, length)

    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = heads < num_heads
    lora = tl.arange(0, LORA_PAD)  # widths padded to powers of two (at least 16) and masked
    rope = tl.arange(0, ROPE_PAD)
    mask_l = lora < LORA
    mask_r = rope < ROPE
    q = tl.load(
        q_ptr + token * stride_qt + heads[:, None] * stride_qh + lora[None, :],
        mask=mask_h[:, None] & mask_l[None, :],
        other=0.0,
    )  # [BLOCK_H, LORA_PAD]
    q_pe = tl.load(
        qpe_ptr + token * stride_pt + heads[:, None] * stride_ph + rope[None, :],
        mask=mask_h[:, None] & mask_r[None, :],
        other=0.0,
    )  # [BLOCK_H, ROPE_PAD]
    if UPCAST:
        q = q.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, LORA_PAD), dtype=tl.float32)
    log2e = 1.4426950408889634
    for key0 in range(start, end, BLOCK_N):
        pos = key0 + tl.arange(0, BLOCK_N)
        mask_n = pos < end
        page = tl.load(table_ptr + seq * stride_table + pos // PAGE, mask=mask_n, other=0)
        rows = page.to(tl.int64) * PAGE + pos % PAGE
        c_kv = tl.load(
            kv_ptr + rows[:, None] * stride_kv + lora[None, :],
            mask=mask_n[:, None] & mask_l[None, :],
            other=0.0,
        )  # [BLOCK_N, LORA_PAD]
        k_pe = tl.load(
            kv_ptr + rows[:, None] * stride_kv + LORA + rope[None, :],
            mask=mask_n[:, None] & mask_r[None, :],
            other=0.0,
        )  # [BLOCK_N, ROPE_PAD]
        if UPCAST:
            c_kv = c_kv.to(tl.float32)
            k_pe = k_pe.to(tl.float32)
        scores = tl.dot(q, tl.trans(c_kv), input_precision="ieee") + tl.dot(
            q_pe, tl.trans(k_pe), input_precision="ieee"
        )  # [BLOCK_H, BLOCK_N]
        scores = tl.where(mask_n[None, :], scores * (scale * log2e), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c_kv.dtype), c_kv, input_precision="ieee")
        m_i = m_new

    has_keys = start < end
    out = tl.where(has_keys, acc / tl.maximum(l_i, 1e-30)[:, None], 0.0)
    lse = tl.where(has_keys, (m_i + tl.log2(tl.maximum(l_i, 1e-30))) / log2e, float("-inf"))
    tl.store(
        out_ptr
        + token * stride_ot
        + heads[:, None] * stride_oh
        + split * stride_os
        + lora[None, :],
        out,
        mask=mask_h[:, None] & mask_l[None, :],
    )
    tl.store(lse_ptr + token * stride_lt + heads * stride_lh + split, lse, mask=mask_h)
