"""Paged, weight-absorbed MLA decode against its torch reference and the model's own forms."""

from __future__ import annotations

import pytest
import torch

from backend.kernels import mla_decode
from backend.model.cache import PagedLatentCache
from backend.model.mla import attention_absorbed, attention_absorbed_chunk

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

HEADS, LORA, ROPE, NOPE, V = 4, 32, 16, 8, 8
SCALE = 0.2


def _cache(page: int, context_lens: list[int], dtype: torch.dtype, device: torch.device):
    """A layer of random latent rows and shuffled block tables covering ``context_lens``."""
    generator = torch.Generator().manual_seed(page)
    needed = [-(-length // page) for length in context_lens]
    order = torch.randperm(sum(needed) + 2, generator=generator).tolist()
    tables, start = [], 0
    for count in needed:
        tables.append(order[start : start + count])
        start += count
    cache = PagedLatentCache(1, sum(needed) + 2, page, LORA + ROPE, dtype, device)
    cache.kv[0] = torch.randn(cache.kv.shape[1:], generator=generator).to(dtype)
    return cache, tables


def _queries(num_tokens: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(num_tokens, HEADS, width, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kernel_matches_reference(
    device: torch.device, act_dtype: torch.dtype, page: int, num_splits: int
) -> None:
    # Plain decode tokens and a 1 + 2 speculative sequence, contexts from 1 row to 3 pages.
    seq_lens_q, context_lens = [1, 3, 1, 1], [1, 40, 3 * page, page + 1]
    cache, tables = _cache(page, context_lens, act_dtype, device)
    token_seq, token_len = mla_decode.token_layout(seq_lens_q, context_lens, device)
    block_tables = mla_decode.block_table_tensor(tables, device)
    q_latent = _queries(6, LORA, 1).to(device)
    q_pe = _queries(6, ROPE, 2).to(device)
    expected = mla_decode.mla_decode_reference(
        q_latent, q_pe, cache.kv[0], block_tables, token_seq, token_len, SCALE, page
    )
    tiles = mla_decode.DecodeTiles(block_h=16, block_n=16, num_splits=num_splits)
    got = mla_decode.mla_decode(
        q_latent, q_pe, cache.kv[0], block_tables, token_seq, token_len, SCALE, page, tiles
    )
    tolerance = 2e-2 if act_dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=tolerance, atol=tolerance)


def test_token_layout_of_speculative_queries() -> None:
    token_seq, token_len = mla_decode.token_layout([1, 3], [5, 10])
    assert token_seq.tolist() == [0, 1, 1, 1]
    assert token_len.tolist() == [5, 8, 9, 10]  # the i-th of 3 new tokens sees 10 - 3 + i + 1
    with pytest.raises(ValueError, match="new tokens"):
        mla_decode.token_layout([3], [2])


def test_absorbed_attention_equals_the_models_forms(device: torch.device) -> None:
    """The kernel path (W_UK in, latent attention, W_UV out) == the model's CPU forms: one
    decode token per sequence (``attention_absorbed``) and a 1 + k chunk
    (``attention_absorbed_chunk``)."""
    page = 16
    seq_lens_q, context_lens = [1, 1, 3], [7, 33, 20]
    cache, tables = _cache(page, context_lens, torch.float32, device)
    generator = torch.Generator().manual_seed(3)
    w_uk = torch.randn(HEADS, NOPE, LORA, generator=generator) / LORA**0.5
    w_uv = torch.randn(HEADS, V, LORA, generator=generator) / LORA**0.5
    q_nope, q_pe = _queries(5, NOPE, 4), _queries(5, ROPE, 5)
    got = mla_decode.paged_absorbed_attention(
        q_nope.to(device), q_pe.to(device), cache.kv[0], tables, seq_lens_q, context_lens,
        w_uk.to(device), w_uv.to(device), SCALE, page,
    ).cpu()  # fmt: skip
    cpu_cache = cache.kv.cpu()
    host = PagedLatentCache(1, cache.num_blocks, page, LORA + ROPE, torch.float32, "cpu")
    host.kv.copy_(cpu_cache)
    latents, valid = host.gather_batch(0, tables[:2], context_lens[:2])
    decode = attention_absorbed(q_nope[:2], q_pe[:2], latents, valid, w_uk, w_uv, SCALE)
    chunk = attention_absorbed_chunk(
        q_nope[2:], q_pe[2:], host.gather(0, tables[2], context_lens[2]), w_uk, w_uv, SCALE
    )
    torch.testing.assert_close(got, torch.cat((decode, chunk)), rtol=1e-5, atol=1e-5)


def test_wrapper_rejects_bad_inputs(device: torch.device) -> None:
    cache, tables = _cache(16, [5], torch.float32, device)
    token_seq, token_len = mla_decode.token_layout([1], [5], device)
    block_tables = mla_decode.block_table_tensor(tables, device)
    q, q_pe = _queries(1, LORA, 0).to(device), _queries(1, ROPE, 0).to(device)
    kv = cache.kv[0]
    with pytest.raises(ValueError, match="kv must be"):
        mla_decode.mla_decode(q, q_pe, kv[:, :40], block_tables, token_seq, token_len, 1.0, 16)
    with pytest.raises(ValueError, match="int32"):
        mla_decode.mla_decode(q, q_pe, kv, block_tables.long(), token_seq, token_len, 1.0, 16)
    with pytest.raises(ValueError, match="one entry per query token"):
        mla_decode.mla_decode(q, q_pe, kv, block_tables, token_seq[:0], token_len, 1.0, 16)


def test_widths_that_are_not_powers_of_two(device: torch.device) -> None:
    """kv_lora_rank 24 and rope 8 (below tl.dot's 16): padded in registers, masked in memory."""
    lora, rope, page = 24, 8, 16
    generator = torch.Generator().manual_seed(7)
    kv = torch.randn(3 * page, lora + rope, generator=generator).to(device)
    token_seq, token_len = mla_decode.token_layout([2], [40], device)
    block_tables = mla_decode.block_table_tensor([[2, 0, 1]], device)
    q = torch.randn(2, HEADS, lora, generator=generator).to(device)
    q_pe = torch.randn(2, HEADS, rope, generator=generator).to(device)
    expected = mla_decode.mla_decode_reference(
        q, q_pe, kv, block_tables, token_seq, token_len, SCALE, page
    )
    got = mla_decode.mla_decode(q, q_pe, kv, block_tables, token_seq, token_len, SCALE, page)
    torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=1e-5, atol=1e-5)
