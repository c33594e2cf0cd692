"""Multi-head latent attention over the paged latent cache.

Per token the layer caches one latent row [c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)]:
``kv_a_layernorm`` is applied to c_kv and RoPE to k_pe before caching. A sequence that brings
several new tokens (a prefill chunk, possibly after earlier context) attends in the expanded
form: c_kv goes through ``kv_b_proj`` into per-head K_nope and V. Decode attends in the
weight-absorbed form: W_UK folds into the query and W_UV into the output, so attention is
multi-query over the 576-wide latent with a 512-wide value; a decode that verifies k drafts
(1 + k new tokens) takes the same batched path, each new token one row seeing its own prefix.
A longer chunk over a long context also takes the absorbed form (``attention_absorbed_chunk``)
when ``absorbed_is_cheaper`` says so: it skips expanding the whole context; otherwise a chunk
after cached context reads that context from the paged cache a chunk of blocks at a time
(``mla_prefix.attention_over_prefix``), with no dense copy of it. A decode batch may carry its
kernel layout on the device (``ForwardBatch.decode``, built once a step, static under a CUDA
graph). All forms are pure functions of tensors so a GPU kernel can replace any of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backend.kernels import small_ops, support
from backend.kernels.mla_decode import absorbed_attention, paged_absorbed_attention
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.config import ModelConfig
from backend.model.fp8_linear import dense_weight
from backend.model.layers import Linear, RMSNorm
from backend.model.mla_prefix import attention_over_prefix, expand_rows, query_rows
from backend.model.rope import apply_rotary
from backend.native import ops


def chunk_mask(num_q: int, length: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
    """Additive mask [Q, L] for the last Q of L tokens: query i (position L - Q + i) sees keys
    0 .. L - Q + i. None when Q == L (plain causal attention: pass ``is_causal``)."""
    if num_q == length:
        return None
    mask = torch.zeros(num_q, length, dtype=dtype, device=device)
    hidden = torch.full((num_q, num_q), float("-inf"), dtype=dtype, device=device)
    mask[:, length - num_q :] = hidden.triu_(1)
    return mask


def attention_expanded(
    q_nope: Tensor,
    q_pe: Tensor,
    latents: Tensor,
    kv_b_weight: Tensor,
    kv_lora_rank: int,
    v_head_dim: int,
    scale: float,
) -> Tensor:
    """Causal attention of the last Q new tokens over L cached tokens of one sequence.

    q_nope [Q, H, nope], q_pe [Q, H, rope] (rotated), latents [L, kv_lora_rank + rope] with the
    Q new tokens last, kv_b_weight [H * (nope + v), kv_lora_rank], v <= nope + rope. Returns
    [Q, H, v].
    """
    num_q, num_heads, nope = q_nope.shape
    key_dim = nope + q_pe.shape[-1]
    if v_head_dim > key_dim:
        raise ValueError(f"v_head_dim {v_head_dim} exceeds the key width {key_dim}")
    length = latents.shape[0]
    if kv_b_weight.shape[1] != kv_lora_rank:
        raise ValueError(f"kv_b_proj takes {kv_b_weight.shape[1]} inputs, not {kv_lora_rank}")
    # SDPA's fused CPU kernel needs value as wide as the key: rows [k_pe | k_nope | v] per
    # head give both as views, key = the first key_dim columns, value = the last key_dim (v at
    # its end, the columns before it are dropped from the output).
    rows = expand_rows(latents, kv_b_weight, num_heads, nope, v_head_dim)  # [H, L, key_dim + v]
    query = query_rows(q_nope, q_pe)  # [H, Q, key_dim]
    mask = chunk_mask(num_q, length, query.dtype, query.device)
    out = F.scaled_dot_product_attention(
        query[None],
        rows[None, :, :, :key_dim],
        rows[None, :, :, v_head_dim:],
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
    )  # [1, H, Q, key_dim]
    return out[0, :, :, key_dim - v_head_dim :].transpose(0, 1)


def attention_absorbed(
    q_nope: Tensor,
    q_pe: Tensor,
    latents: Tensor,
    valid: Tensor,
    w_uk: Tensor,
    w_uv: Tensor,
    scale: float,
) -> Tensor:
    """One new token per sequence attending over its padded cached latents.

    q_nope [S, H, nope], q_pe [S, H, rope], latents [S, L, kv_lora_rank + rope], valid [S, L]
    bool, w_uk [H, nope, kv_lora_rank], w_uv [H, v, kv_lora_rank]. Returns [S, H, v] in the
    query's dtype. Computed in fp32: reference numerics, and on CPU faster than bf16 batched
    matmuls whose shape (the context length) changes every step.
    """
    out_dtype = q_nope.dtype
    q_nope, q_pe, latents = q_nope.float(), q_pe.float(), latents.float()
    kv_lora_rank = w_uk.shape[-1]
    q_latent = torch.einsum("shn,hnr->shr", q_nope, w_uk.float())  # [S, H, kv_lora_rank]
    query = torch.cat((q_latent, q_pe), dim=-1)  # [S, H, latent_dim]
    scores = torch.bmm(query, latents.transpose(1, 2)) * scale  # [S, H, L]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    out_latent = torch.bmm(scores.softmax(dim=-1), latents[:, :, :kv_lora_rank])
    return torch.einsum("shr,hvr->shv", out_latent, w_uv.float()).to(out_dtype)


def attention_absorbed_chunk(
    q_nope: Tensor,
    q_pe: Tensor,
    latents: Tensor,
    w_uk: Tensor,
    w_uv: Tensor,
    scale: float,
) -> Tensor:
    """``attention_expanded``'s result in the absorbed form, without expanding the context.

    q_nope [Q, H, nope], q_pe [Q, H, rope] (rotated), latents [L, kv_lora_rank + rope] with the
    Q new tokens last, w_uk [H, nope, kv_lora_rank], w_uv [H, v, kv_lora_rank]. Returns
    [Q, H, v] in the query's dtype; computed in fp32 like ``attention_absorbed``.
    """
    out_dtype = q_nope.dtype
    num_q, num_heads, _ = q_nope.shape
    length, latent_dim = latents.shape
    kv_lora_rank = w_uk.shape[-1]
    latents = latents.float()
    q_latent = torch.einsum("qhn,hnr->hqr", q_nope.float(), w_uk.float())  # [H, Q, kv_lora_rank]
    query = torch.cat((q_latent, q_pe.float().transpose(0, 1)), dim=-1)  # [H, Q, latent_dim]
    # One latent row serves every head as key and (its first kv_lora_rank values) as value;
    # the value keeps the key's width because SDPA's fused CPU kernel needs that.
    shared = latents[None, None].expand(1, num_heads, length, latent_dim)
    mask = chunk_mask(num_q, length, query.dtype, query.device)
    out = F.scaled_dot_product_attention(
        query[None], shared, shared, attn_mask=mask, is_causal=mask is None, scale=scale
    )  # [1, H, Q, latent_dim]
    out_latent = out[0, :, :, :kv_lora_rank]
    return torch.einsum("hqr,hvr->qhv", out_latent, w_uv.float()).to(out_dtype)


def absorbed_is_cheaper(
    num_q: int, length: int, kv_lora_rank: int, nope: int, rope: int, v_head_dim: int
) -> bool:
    """Whether a chunk of ``num_q`` new tokens over ``length`` cached ones (its own included)
    costs fewer multiply-adds in the absorbed form than in the expanded one.

    Per head, with r = kv_lora_rank:
      expanded = L * r * (nope + v)        kv_b_proj over the whole context
               + Q * L * (nope + rope + v)  scores and values per query-key pair
      absorbed = Q * r * (nope + v)        W_UK into each query, W_UV out of it
               + Q * L * (2 * r + rope)     scores over the latent, latent-wide values
    Both forms compute every pair of a chunk with context (the mask skips no work). With
    2 * r > nope + v, as in DeepSeek's shapes, the absorbed form wins only when the context is
    long relative to the chunk: Q below about r * (nope + v) / (2 * r - nope - v) (170 for the
    real model, 128 for the "small" demo preset), never for a cold prefill (Q == L).
    """
    r = kv_lora_rank
    expanded = length * r * (nope + v_head_dim) + num_q * length * (nope + rope + v_head_dim)
    absorbed = num_q * r * (nope + v_head_dim) + num_q * length * (2 * r + rope)
    return absorbed < expanded


# Sequences bringing at most this many new tokens (a decode and its draft tokens) attend
# together in the absorbed form; longer chunks attend one by one.
MAX_SHORT_QUERY = 4


class MLA(nn.Module):
    """Attention block; parameter names follow the HF checkpoint (``self_attn.*``)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        mla = config.mla
        self.num_heads = mla.num_heads
        self.kv_lora_rank = mla.kv_lora_rank
        self.qk_nope_head_dim = mla.qk_nope_head_dim
        self.qk_rope_head_dim = mla.qk_rope_head_dim
        self.v_head_dim = mla.v_head_dim
        self.scale = config.softmax_scale
        hidden, bias = config.hidden_size, mla.attention_bias
        q_out = mla.num_heads * mla.qk_head_dim
        self.q_proj: Linear | None = None
        self.q_a_proj: Linear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: Linear | None = None
        if mla.q_lora_rank is None:
            self.q_proj = Linear(hidden, q_out, bias=False, dtype=dtype)
        else:
            self.q_a_proj = Linear(hidden, mla.q_lora_rank, bias=bias, dtype=dtype)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, config.rms_norm_eps, dtype)
            self.q_b_proj = Linear(mla.q_lora_rank, q_out, bias=False, dtype=dtype)
        self.kv_a_proj_with_mqa = Linear(hidden, mla.latent_dim, bias=bias, dtype=dtype)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, config.rms_norm_eps, dtype)
        kv_b_out = mla.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        self.kv_b_proj = Linear(mla.kv_lora_rank, kv_b_out, bias=False, dtype=dtype)
        self.o_proj = Linear(mla.num_heads * mla.v_head_dim, hidden, bias=bias, dtype=dtype)

    def _query(self, x: Tensor) -> Tensor:  # x: [T, D] -> [T, H, qk_head_dim]
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            assert self.q_a_proj is not None and self.q_a_layernorm is not None
            assert self.q_b_proj is not None
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.view(x.shape[0], self.num_heads, -1)

    def absorbed_weights(self) -> tuple[Tensor, Tensor]:
        """Views of kv_b_proj: W_UK [H, nope, kv_lora_rank] and W_UV [H, v, kv_lora_rank]."""
        per_head = dense_weight(self.kv_b_proj).view(
            self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank
        )
        return per_head[:, : self.qk_nope_head_dim], per_head[:, self.qk_nope_head_dim :]

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        batch: ForwardBatch,
        cache: PagedLatentCache,
        cache_layer: int,
        rows: list[int] | None = None,
    ) -> Tensor:
        """x [T, D] -> [T, D]; writes the T new latent rows into ``cache_layer`` first.

        ``rows`` (increasing flat rows): only their outputs are wanted, [R, D]; the latents of
        all T rows are still written, and each wanted row attends as a decode over its
        sequence's cache up to itself."""
        kv = self.kv_a_proj_with_mqa(x)
        self._write_latents(kv, cos, sin, batch, cache, cache_layer)
        if rows is not None:
            if not rows:
                return x.new_empty(0, x.shape[-1])
            index = torch.tensor(rows, dtype=torch.long, device=x.device)
            x, cos, sin = (t.index_select(0, index) for t in (x, cos, sin))
            batch = batch.rows_as_decodes(rows)
        q = self._query(x)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = apply_rotary(q_pe, cos, sin)
        out = self._attend(q_nope, q_pe, batch, cache, cache_layer)
        return self.o_proj(out.flatten(1))

    def _write_latents(
        self,
        kv: Tensor,
        cos: Tensor,
        sin: Tensor,
        batch: ForwardBatch,
        cache: PagedLatentCache,
        cache_layer: int,
    ) -> None:
        """kv_a's output [T, kv_lora_rank + rope] -> [norm(c_kv) | rotated k_pe] at the batch's
        slots: one fused kernel on a GPU, else the norm, the rotation and the copy."""
        norm = self.kv_a_layernorm
        layer = cache.kv[cache_layer]
        if (
            support.use_kernels(kv)
            and kv.dtype == layer.dtype == norm.weight.dtype
            and kv.stride(-1) == 1
            and cos.dtype == sin.dtype == torch.float32
        ):
            small_ops.write_latents(kv, norm.weight, norm.eps, cos, sin, layer, batch.slot_mapping)
            return
        c_kv, k_pe = kv.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        latent = torch.cat((norm(c_kv), apply_rotary(k_pe, cos, sin)), dim=-1)
        cache.write(cache_layer, batch.slot_mapping, latent)

    def _attend(
        self,
        q_nope: Tensor,
        q_pe: Tensor,
        batch: ForwardBatch,
        cache: PagedLatentCache,
        cache_layer: int,
    ) -> Tensor:
        """[T, H, v]: sequences with a few new tokens (decodes, decodes with drafts) together in
        the absorbed form, longer chunks one by one."""
        short = [s for s, q_len in enumerate(batch.seq_lens_q) if q_len <= MAX_SHORT_QUERY]
        if len(short) == batch.num_seqs:
            return self._attend_decode(q_nope, q_pe, batch, cache, cache_layer, short)
        out = q_nope.new_empty(q_nope.shape[0], self.num_heads, self.v_head_dim)
        starts = batch.query_starts()
        if short:
            rows = torch.tensor(
                [r for s in short for r in range(starts[s], starts[s + 1])], device=q_nope.device
            )
            out[rows] = self._attend_decode(
                q_nope[rows], q_pe[rows], batch, cache, cache_layer, short
            )
        for seq, q_len in enumerate(batch.seq_lens_q):
            if q_len <= MAX_SHORT_QUERY:
                continue
            rows_slice = slice(starts[seq], starts[seq + 1])
            length, table = batch.context_lens[seq], batch.block_tables[seq]
            if length > q_len and not self._absorbed_is_cheaper(q_len, length):
                # after a cached prefix: read it from the paged cache a chunk at a time
                own = cache.kv[cache_layer].index_select(0, batch.slot_mapping[rows_slice])
                out[rows_slice] = attention_over_prefix(
                    q_nope[rows_slice], q_pe[rows_slice], own, cache.kv[cache_layer], table,
                    length - q_len, cache.block_size, dense_weight(self.kv_b_proj),
                    self.v_head_dim, self.scale,
                )  # fmt: skip
                continue
            latents = cache.gather(cache_layer, table, length)
            out[rows_slice] = self._attend_chunk(
                q_nope[rows_slice], q_pe[rows_slice], latents.to(q_nope.dtype)
            )
        return out

    def _absorbed_is_cheaper(self, num_q: int, length: int) -> bool:
        return absorbed_is_cheaper(
            num_q, length, self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim,
            self.v_head_dim,
        )  # fmt: skip

    def _attend_chunk(self, q_nope: Tensor, q_pe: Tensor, latents: Tensor) -> Tensor:
        """[Q, H, v] for one sequence's chunk, in whichever form costs less."""
        if self._absorbed_is_cheaper(q_nope.shape[0], latents.shape[0]):
            w_uk, w_uv = self.absorbed_weights()
            return attention_absorbed_chunk(q_nope, q_pe, latents, w_uk, w_uv, self.scale)
        return attention_expanded(
            q_nope,
            q_pe,
            latents,
            dense_weight(self.kv_b_proj),
            self.kv_lora_rank,
            self.v_head_dim,
            self.scale,
        )

    def _attend_native(
        self,
        q_nope: Tensor,
        q_pe: Tensor,
        kv: Tensor,
        table: list[int],
        q_len: int,
        end: int,
        block_size: int,
    ) -> Tensor | None:
        """[q_len, H, v] for one sequence's decode token and its drafts by the C kernel, each
        token over the cache up to its own position; None where the kernel does not apply."""
        kv_b = dense_weight(self.kv_b_proj)
        rows = []
        for j in range(q_len):
            row = ops.mla_decode(
                q_nope[j : j + 1], q_pe[j : j + 1], kv, table, end - q_len + 1 + j, block_size,
                kv_b, self.v_head_dim, self.scale,
            )  # fmt: skip
            if row is None:
                return None
            rows.append(row)
        return rows[0] if q_len == 1 else torch.cat(rows)

    def _attend_decode(
        self,
        q_nope: Tensor,
        q_pe: Tensor,
        batch: ForwardBatch,
        cache: PagedLatentCache,
        cache_layer: int,
        seqs: list[int],
    ) -> Tensor:
        """[N, H, v] for the new tokens of ``seqs`` (N in flat order, at most MAX_SHORT_QUERY
        each). On CPU every new token is one row of the batched decode attention: the token at
        position p of a sequence reads that sequence's cache up to p (its drafts' latents after
        it are in the cache already, and masked out)."""
        tables = [batch.block_tables[s] for s in seqs]
        q_lens = [batch.seq_lens_q[s] for s in seqs]
        lengths = [batch.context_lens[s] for s in seqs]
        if len(seqs) == 1 and not support.use_kernels(q_nope):
            native = self._attend_native(q_nope, q_pe, cache.kv[cache_layer], tables[0],
                                         q_lens[0], lengths[0], cache.block_size)  # fmt: skip
            if native is not None:
                return native
        w_uk, w_uv = self.absorbed_weights()
        layout = batch.decode
        if support.use_kernels(q_nope) and layout is not None and len(seqs) == batch.num_seqs:
            return absorbed_attention(
                q_nope, q_pe, cache.kv[cache_layer], layout.block_tables, layout.token_seq,
                layout.token_len, w_uk, w_uv, self.scale, cache.block_size, layout.max_len,
            )  # fmt: skip
        if support.use_kernels(q_nope):
            return paged_absorbed_attention(
                q_nope, q_pe, cache.kv[cache_layer], tables, q_lens, lengths,
                w_uk, w_uv, self.scale, cache.block_size,
            )  # fmt: skip
        if max(q_lens) > 1:
            rows = list(zip(tables, q_lens, lengths, strict=True))
            tables = [table for table, q_len, _ in rows for _ in range(q_len)]
            lengths = [end - q_len + 1 + j for _, q_len, end in rows for j in range(q_len)]
        latents, valid = cache.gather_batch(cache_layer, tables, lengths)
        return attention_absorbed(
            q_nope, q_pe, latents.to(q_nope.dtype), valid, w_uk, w_uv, self.scale
        )
