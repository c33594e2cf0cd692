"""Weight-absorbed MLA decode over the paged latent cache, for 1 + k query tokens per sequence.

Query token t of a batch belongs to sequence ``token_seq[t]`` and sees that sequence's first
``token_len[t]`` cached rows (its own included): a plain decode token sees the whole context, the
i-th of n speculative tokens sees ``context_len - n + i + 1`` rows. The cache layer ``kv`` is
[slots, LORA + ROPE]; slot = block_tables[s][pos // page] * page + pos % page. The kernel returns
the attention output in latent space [T, H, LORA] (fp32); ``absorbed_attention`` folds W_UK into
the query before it and W_UV into the output after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from backend.kernels import support


@dataclass(frozen=True)
class DecodeTiles:
    """Heads per program, keys per inner step, key ranges per token (flash-decoding splits)."""

    block_h: int = 16
    block_n: int = 32
    num_splits: int | None = None  # None: chosen from the batch size and the longest context
    num_warps: int = 4
    num_stages: int = 2


def choose_tiles(num_tokens: int, num_heads: int) -> DecodeTiles:
    """Many query tokens: up to 64 heads per program, so each cached row is read once for 64
    heads; few tokens: 16 heads per program, for more programs. Both with 8 warps, the fastest
    correct tilings at V3.1's widths on an H200 (``benchmarks/kernel_tiles.py``)."""
    if num_tokens >= 16:
        return DecodeTiles(block_h=min(64, _padded(num_heads)), block_n=64, num_warps=8)
    return DecodeTiles(block_h=16, block_n=32, num_warps=8)


def token_layout(
    seq_lens_q: Sequence[int], context_lens: Sequence[int], device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """(token_seq [T] int32, token_len [T] int32) for sequences that bring ``seq_lens_q[s]`` new
    tokens each and hold ``context_lens[s]`` rows after this step (the new ones last)."""
    seqs: list[int] = []
    lengths: list[int] = []
    for seq, (q_len, ctx) in enumerate(zip(seq_lens_q, context_lens, strict=True)):
        if q_len < 1 or ctx < q_len:
            raise ValueError(f"sequence {seq}: {q_len} new tokens with context {ctx}")
        seqs.extend([seq] * q_len)
        lengths.extend(range(ctx - q_len + 1, ctx + 1))
    return (
        torch.tensor(seqs, dtype=torch.int32, device=device),
        torch.tensor(lengths, dtype=torch.int32, device=device),
    )


def block_table_tensor(
    block_tables: Sequence[Sequence[int]], device: torch.device | str = "cpu"
) -> Tensor:
    """[S, max_blocks] int32, rows padded with block 0 (never read past a sequence's length)."""
    width = max(1, max(len(table) for table in block_tables))
    rows = [list(table) + [0] * (width - len(table)) for table in block_tables]
    return torch.tensor(rows, dtype=torch.int32, device=device)


# --- torch reference (the oracle) ------------------------------------------------------------


def mla_decode_reference(
    q_latent: Tensor,
    q_pe: Tensor,
    kv: Tensor,
    block_tables: Tensor,
    token_seq: Tensor,
    token_len: Tensor,
    scale: float,
    page_size: int,
) -> Tensor:
    """[T, H, LORA] fp32: softmax(q . key * scale) @ value per token, over its visible rows."""
    lora = q_latent.shape[-1]
    out = torch.empty(q_latent.shape, dtype=torch.float32, device=q_latent.device)
    for t in range(q_latent.shape[0]):
        length = int(token_len[t])
        positions = torch.arange(length, device=kv.device)
        pages = block_tables[int(token_seq[t])].long()[positions // page_size]
        rows = kv.index_select(0, pages * page_size + positions % page_size).float()  # [L, 576]
        query = torch.cat((q_latent[t], q_pe[t]), dim=-1).float()  # [H, 576]
        weights = (query @ rows.t() * scale).softmax(dim=-1)  # [H, L]
        out[t] = weights @ rows[:, :lora]
    return out


# --- wrappers -------------------------------------------------------------------------------


def _padded(width: int) -> int:
    """Register width for a row segment: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, 1 << (width - 1).bit_length())


def _num_splits(tiles: DecodeTiles, num_tokens: int, num_heads: int, max_len: int) -> int:
    if tiles.num_splits is not None:
        return tiles.num_splits
    programs = num_tokens * -(-num_heads // tiles.block_h)
    wanted = -(-264 // programs)  # about two programs per SM of an H100/H200
    return max(1, min(wanted, -(-max_len // 256), 32))


def _check(
    q_latent: Tensor, q_pe: Tensor, kv: Tensor, block_tables: Tensor, seq: Tensor, lens: Tensor
) -> None:
    if q_latent.dim() != 3 or q_pe.dim() != 3 or q_latent.shape[:2] != q_pe.shape[:2]:
        raise ValueError(
            f"q_latent {tuple(q_latent.shape)} and q_pe {tuple(q_pe.shape)} must be [T, H, *]"
        )
    lora, rope = q_latent.shape[-1], q_pe.shape[-1]
    if kv.dim() != 2 or kv.shape[1] != lora + rope:
        raise ValueError(f"kv must be [slots, {lora + rope}], got {tuple(kv.shape)}")
    for name, tensor in (("block_tables", block_tables), ("token_seq", seq), ("token_len", lens)):
        if tensor.dtype != torch.int32:
            raise ValueError(f"{name} must be int32, got {tensor.dtype}")
    if block_tables.dim() != 2 or not block_tables.is_contiguous():
        raise ValueError("block_tables must be a contiguous [S, max_blocks] tensor")
    if seq.shape != (q_latent.shape[0],) or lens.shape != seq.shape:
        raise ValueError("token_seq and token_len need one entry per query token")
    for name, tensor in (("q_latent", q_latent), ("q_pe", q_pe), ("kv", kv)):
        support.check_contiguous_rows(name, tensor)


def mla_decode(
    q_latent: Tensor,
    q_pe: Tensor,
    kv: Tensor,
    block_tables: Tensor,
    token_seq: Tensor,
    token_len: Tensor,
    scale: float,
    page_size: int,
    tiles: DecodeTiles | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Triton: what ``mla_decode_reference`` computes. q_latent [T, H, LORA], q_pe [T, H, ROPE],
    kv [slots, LORA + ROPE] (one cache layer), block_tables [S, B] int32, token_seq and
    token_len [T] int32. Returns [T, H, LORA] fp32. ``max_len`` bounds token_len (it sets the
    number of key splits); None reads it from the device, which a captured graph cannot."""
    support.check_device(q_latent, q_pe, kv, block_tables, token_seq, token_len)
    from backend.kernels import _mla_decode_triton as kernels

    _check(q_latent, q_pe, kv, block_tables, token_seq, token_len)
    num_tokens, num_heads, lora = q_latent.shape
    tiles = tiles or choose_tiles(num_tokens, num_heads)
    if max_len is None:
        max_len = int(token_len.max()) if num_tokens else 0
    splits = _num_splits(tiles, num_tokens, num_heads, max_len)
    partial = torch.empty(
        num_tokens, num_heads, splits, lora, dtype=torch.float32, device=kv.device
    )
    lse = torch.empty(num_tokens, num_heads, splits, dtype=torch.float32, device=kv.device)
    if num_tokens == 0:
        return partial[:, :, 0]
    if not kv.is_cuda:  # the interpreter: loads are upcast, the query must match
        q_latent, q_pe = q_latent.float(), q_pe.float()
    else:
        q_latent, q_pe = q_latent.to(kv.dtype), q_pe.to(kv.dtype)
    grid = (-(-num_heads // tiles.block_h), splits, num_tokens)
    kernels.mla_decode_kernel[grid](
        q_latent, q_pe, kv, block_tables, token_seq, token_len, partial, lse,
        num_heads, scale,
        q_latent.stride(0), q_latent.stride(1), q_pe.stride(0), q_pe.stride(1), kv.stride(0),
        block_tables.stride(0),
        partial.stride(0), partial.stride(1), partial.stride(2), lse.stride(0), lse.stride(1),
        LORA=lora, ROPE=q_pe.shape[-1], LORA_PAD=_padded(lora), ROPE_PAD=_padded(q_pe.shape[-1]),
        PAGE=page_size, NUM_SPLITS=splits,
        BLOCK_H=tiles.block_h, BLOCK_N=tiles.block_n, UPCAST=support.upcast_loads(kv),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    if splits == 1:
        return partial[:, :, 0]
    weights = lse.softmax(dim=-1)  # empty splits have lse -inf and weigh 0
    return (partial * weights[..., None]).sum(dim=2)


def absorbed_attention(
    q_nope: Tensor,
    q_pe: Tensor,
    kv: Tensor,
    block_tables: Tensor,
    token_seq: Tensor,
    token_len: Tensor,
    w_uk: Tensor,
    w_uv: Tensor,
    scale: float,
    page_size: int,
    max_len: int | None = None,
) -> Tensor:
    """[T, H, v] in q_nope's dtype: W_UK [H, nope, LORA] folded into the query, the kernel over
    the latent cache, W_UV [H, v, LORA] applied to its output."""
    q_latent = torch.einsum("thn,hnr->thr", q_nope, w_uk.to(q_nope.dtype)).contiguous()
    out_latent = mla_decode(
        q_latent, q_pe.contiguous(), kv, block_tables, token_seq, token_len, scale, page_size,
        max_len=max_len,
    )  # fmt: skip
    return torch.einsum("thr,hvr->thv", out_latent, w_uv.float()).to(q_nope.dtype)


def paged_absorbed_attention(
    q_nope: Tensor,
    q_pe: Tensor,
    kv: Tensor,
    block_tables: Sequence[Sequence[int]],
    seq_lens_q: Sequence[int],
    context_lens: Sequence[int],
    w_uk: Tensor,
    w_uv: Tensor,
    scale: float,
    page_size: int,
) -> Tensor:
    """``absorbed_attention`` for a batch described as lists: sequence s brings
    ``seq_lens_q[s]`` new tokens (1 for plain decode, 1 + k when verifying k drafts) and holds
    ``context_lens[s]`` cached rows under ``block_tables[s]``. q_nope [T, H, nope] in flat order."""
    token_seq, token_len = token_layout(seq_lens_q, context_lens, kv.device)
    tables = block_table_tensor(block_tables, kv.device)
    return absorbed_attention(
        q_nope, q_pe, kv, tables, token_seq, token_len, w_uk, w_uv, scale, page_size
    )
