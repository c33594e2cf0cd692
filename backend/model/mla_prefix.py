"""Prefill of new tokens over a cached prefix, read from the paged latent cache chunk by chunk.

The new tokens attend in two parts whose results are merged by their log-sum-exp, as in
flash attention (and vLLM's MLA prefill with context): causally over their own latents, and
over the cached prefix a chunk of blocks at a time, each chunk expanded through ``kv_b_proj``
into per-head K_nope and V and attended with no mask (every prefix key precedes every new
token). No dense copy of the whole context is made and no [Q, L] mask is built; the causal
part over the new tokens skips its upper triangle. ``attention_expanded`` over the gathered
context is the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Prefix keys expanded and attended at a time: bounds the expanded chunk at
# heads x PREFIX_CHUNK_TOKENS x (nope + rope + v) values.
PREFIX_CHUNK_TOKENS = 2048
# Scores formed at once by the unfused attention: heads x queries x keys, at most this many.
_SCORES_BUDGET = 1 << 25
_FLASH_DTYPES = (torch.bfloat16, torch.float16)


def attend_with_lse(
    query: Tensor, rows: Tensor, key_dim: int, causal: bool, scale: float, fused: bool | None = None
) -> tuple[Tensor, Tensor]:
    """Attention of query [H, Q, key_dim] over rows [H, L, key_dim + v] (key: the first
    key_dim columns; value: the last v). ``causal``: query i sees keys 0..i (Q == L).

    Returns (out [H, Q, v] in fp32, lse [H, Q] fp32, the log of each softmax's denominator).
    ``fused`` (default: on CPU, and on CUDA in bf16 or fp16) uses torch's flash attention, which
    returns the log-sum-exp; otherwise the scores are formed in fp32, a bounded block of
    queries at a time.
    """
    v_dim = rows.shape[-1] - key_dim
    key, value = rows[:, :, :key_dim], rows[:, :, v_dim:]  # value as wide as the key
    device = query.device.type
    if fused is None:
        fused = device == "cpu" or (device == "cuda" and query.dtype in _FLASH_DTYPES)
    if fused:
        if device == "cpu":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query[None], key[None], value[None], 0.0, causal, scale=scale
            )
        else:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
                query[None], key[None], value[None], 0.0, causal, False, scale=scale
            )[:2]
        return out[0, :, :, key_dim - v_dim :].float(), lse[0].float()
    num_heads, num_q, _ = query.shape
    length = key.shape[1]
    step = max(1, _SCORES_BUDGET // (num_heads * length))
    outs, lses = [], []
    for first in range(0, num_q, step):
        block = query[:, first : first + step].float()
        scores = torch.matmul(block, key.float().transpose(1, 2)) * scale  # [H, q, L]
        if causal:
            rows_at = torch.arange(first, first + block.shape[1], device=query.device)
            hidden = torch.arange(length, device=query.device)[None, :] > rows_at[:, None]
            scores = scores.masked_fill(hidden, float("-inf"))
        lse = scores.logsumexp(dim=-1)
        weights = (scores - lse[..., None]).exp()
        outs.append(torch.matmul(weights, rows[:, :, key_dim:].float()))
        lses.append(lse)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=1)


def merge_attention(
    out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    """Two attentions of the same queries over disjoint keys as one: out [H, Q, v], lse
    [H, Q], all fp32."""
    lse = torch.logaddexp(lse_a, lse_b)
    return (
        out_a * (lse_a - lse).exp()[..., None] + out_b * (lse_b - lse).exp()[..., None],
        lse,
    )


def expand_rows(
    latents: Tensor, kv_b_weight: Tensor, num_heads: int, nope: int, v_head_dim: int
) -> Tensor:
    """latents [L, kv_lora_rank + rope] -> rows [H, L, rope + nope + v]: per head
    [k_pe | k_nope | v], with k_pe shared by the heads and c_kv expanded through kv_b_proj by
    one batched product written in place (kv_b_proj's rows per head are [nope | v], so its
    output lands after k_pe with no transposing copy). The key is the first rope + nope
    columns (the query is [q_pe | q_nope]); a value as wide as the key, which SDPA's fused CPU
    kernel needs, is the last rope + nope columns, v at its end."""
    length = latents.shape[0]
    kv_lora_rank = kv_b_weight.shape[1]
    c_kv, k_pe = latents[:, :kv_lora_rank], latents[:, kv_lora_rank:]
    rope = k_pe.shape[-1]
    per_head = kv_b_weight.reshape(num_heads, nope + v_head_dim, kv_lora_rank).transpose(1, 2)
    if torch.is_grad_enabled() and (latents.requires_grad or kv_b_weight.requires_grad):
        # training (the demo's): the same rows by differentiable ops, out= has no gradient
        shared = k_pe[None].expand(num_heads, length, rope)
        return torch.cat((shared, torch.matmul(c_kv, per_head)), dim=-1)
    rows = latents.new_empty(num_heads, length, rope + nope + v_head_dim)
    expanded = rows[:, :, rope:]
    torch.baddbmm(
        expanded, c_kv.expand(num_heads, length, kv_lora_rank), per_head, beta=0, out=expanded
    )
    rows[:, :, :rope] = k_pe[None]
    return rows


def query_rows(q_nope: Tensor, q_pe: Tensor) -> Tensor:
    """q_nope [Q, H, nope], q_pe [Q, H, rope] -> [H, Q, rope + nope], ``expand_rows``' key
    order."""
    return torch.cat((q_pe, q_nope), dim=-1).transpose(0, 1)


def attention_over_prefix(
    q_nope: Tensor,
    q_pe: Tensor,
    new_latents: Tensor,
    cache_layer: Tensor,
    block_table: list[int],
    num_cached: int,
    block_size: int,
    kv_b_weight: Tensor,
    v_head_dim: int,
    scale: float,
    chunk_tokens: int = PREFIX_CHUNK_TOKENS,
) -> Tensor:
    """What ``attention_expanded`` computes for Q new tokens after ``num_cached`` cached ones,
    without gathering the context.

    q_nope [Q, H, nope], q_pe [Q, H, rope] (rotated), new_latents [Q, kv_lora_rank + rope] (the
    new tokens' own rows), cache_layer [slots, kv_lora_rank + rope] (one layer of the paged
    cache, which holds the prefix under ``block_table``), kv_b_weight [H * (nope + v),
    kv_lora_rank]. Returns [Q, H, v] in the query's dtype.
    """
    _, num_heads, nope = q_nope.shape
    key_dim = nope + q_pe.shape[-1]
    if v_head_dim > key_dim:
        raise ValueError(f"v_head_dim {v_head_dim} exceeds the key width {key_dim}")
    if num_cached < 0 or len(block_table) * block_size < num_cached:
        raise ValueError(f"block table of {len(block_table)} blocks for {num_cached} tokens")
    dtype = q_nope.dtype
    weight = kv_b_weight.to(dtype)
    query = query_rows(q_nope, q_pe)  # [H, Q, key_dim]
    own = expand_rows(new_latents.to(dtype), weight, num_heads, nope, v_head_dim)
    out, lse = attend_with_lse(query, own, key_dim, True, scale)
    blocks = cache_layer.view(-1, block_size, cache_layer.shape[-1])
    chunk_blocks = max(1, chunk_tokens // block_size)
    num_blocks = -(-num_cached // block_size)
    for first in range(0, num_blocks, chunk_blocks):
        ids = block_table[first : min(num_blocks, first + chunk_blocks)]
        table = torch.tensor(ids, dtype=torch.long, device=cache_layer.device)
        start = first * block_size
        count = min(num_cached - start, len(ids) * block_size)
        latents = blocks.index_select(0, table).flatten(0, 1)[:count].to(dtype)
        rows = expand_rows(latents, weight, num_heads, nope, v_head_dim)
        chunk_out, chunk_lse = attend_with_lse(query, rows, key_dim, False, scale)
        out, lse = merge_attention(out, lse, chunk_out, chunk_lse)
    return out.transpose(0, 1).to(dtype)
