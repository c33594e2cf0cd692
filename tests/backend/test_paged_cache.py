"""Paged latent cache: scattered block tables, chunked prefill and mixed batches change nothing."""

from __future__ import annotations

import random

import pytest
import torch

from backend.generate import logits_for
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.model import DeepseekV3ForCausalLM

TOKENS = torch.randint(0, 129280, (70,), generator=torch.Generator().manual_seed(7)).tolist()


def _run(
    model: DeepseekV3ForCausalLM,
    tokens: list[int],
    chunks: list[int],
    block_size: int,
    table: list[int],
    num_blocks: int,
) -> torch.Tensor:
    """Feed ``tokens`` in chunks of the given sizes; return the logits of every position."""
    cache = PagedLatentCache(
        model.num_cache_layers,
        num_blocks,
        block_size,
        model.config.latent_dim,
        torch.float32,
        "cpu",
    )
    logits, start = [], 0
    for size in chunks:
        batch = ForwardBatch.for_prefill(tokens[start : start + size], start, table, block_size)
        logits.append(model.compute_logits(model(batch, cache)))
        start += size
    return torch.cat(logits)


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_scattered_blocks_equal_contiguous(
    tiny_model: DeepseekV3ForCausalLM, block_size: int
) -> None:
    needed = -(-len(TOKENS) // block_size)
    contiguous = list(range(needed))
    scattered = random.Random(block_size).sample(range(3 * needed), needed)
    chunks = [40] + [1] * 30  # prefill, then decode steps
    expected = _run(tiny_model, TOKENS, chunks, block_size, contiguous, needed)
    got = _run(tiny_model, TOKENS, chunks, block_size, scattered, 3 * needed)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 5, 16, 33])
def test_chunked_prefill_equals_one_shot(tiny_model: DeepseekV3ForCausalLM, chunk: int) -> None:
    tokens = TOKENS[:50]
    one_shot = _run(tiny_model, tokens, [50], 16, list(range(4)), 4)
    sizes = [chunk] * (50 // chunk) + ([50 % chunk] if 50 % chunk else [])
    chunked = _run(tiny_model, tokens, sizes, 16, list(range(4)), 4)
    error = (chunked - one_shot).abs().max() / one_shot.abs().max()
    assert error < 1e-5


def test_mixed_batch_equals_separate_runs(tiny_model: DeepseekV3ForCausalLM) -> None:
    # Sequence A decodes one token while B prefills a chunk after earlier context, in one step.
    block_size = 8
    cache = PagedLatentCache(
        tiny_model.num_cache_layers,
        20,
        block_size,
        tiny_model.config.latent_dim,
        torch.float32,
        "cpu",
    )
    a_tokens, b_tokens = TOKENS[:21], TOKENS[30:60]
    a_table, b_table = [9, 3, 17], [0, 12, 5, 7]
    for ids, table, end in ((a_tokens, a_table, 20), (b_tokens, b_table, 10)):
        tiny_model(ForwardBatch.for_prefill(ids[:end], 0, table, block_size), cache)
    batch = ForwardBatch.build(
        [a_tokens[20:21], b_tokens[10:30]], [20, 10], [a_table, b_table], block_size
    )
    logits = tiny_model.compute_logits(tiny_model(batch, cache))
    expected_a = logits_for(tiny_model, a_tokens)[-1]
    expected_b = logits_for(tiny_model, b_tokens)[10:]
    torch.testing.assert_close(logits[0], expected_a, rtol=0, atol=1e-4)
    torch.testing.assert_close(logits[1:], expected_b, rtol=0, atol=1e-4)
    torch.testing.assert_close(batch.last_token_indices(), torch.tensor([0, 20]))


def test_cache_gather_and_sizes() -> None:
    cache = PagedLatentCache(2, 4, 2, 3, torch.float32, "cpu")
    rows = torch.arange(12, dtype=torch.float32).view(4, 3)
    batch = ForwardBatch.for_prefill([5, 6, 7, 8], 0, [3, 1], 2)
    assert batch.slot_mapping.tolist() == [6, 7, 2, 3]
    cache.write(1, batch.slot_mapping, rows)
    torch.testing.assert_close(cache.gather(1, [3, 1], 3), rows[:3])
    assert PagedLatentCache.bytes_per_block(61, 64, 576, torch.bfloat16) == 61 * 64 * 576 * 2
    with pytest.raises(ValueError):
        ForwardBatch.for_prefill([1, 2, 3], 0, [0], 2)  # two blocks needed
