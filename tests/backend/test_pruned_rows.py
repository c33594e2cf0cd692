"""A step's last layer computed for the rows that are read equals the whole layer at those rows,
and every row's latent is cached all the same (the main model's last layer and the MTP layer)."""

from __future__ import annotations

import torch

from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.model import DeepseekV3ForCausalLM

BLOCK = 8


def _tables() -> list[list[int]]:
    return [[3, 9, 1, 7, 12, 2, 14], [5, 0, 11], [4, 8]]


def _step(cache: PagedLatentCache, model: DeepseekV3ForCausalLM) -> ForwardBatch:
    """Prefixes cached first (30 tokens of sequence 0, 12 of sequence 1); then a step of a
    20-token chunk after the cached prefix, one decode token and a 9-token cold prefill."""
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(100, 1000, (80,), generator=gen).tolist()
    tables = _tables()
    model(ForwardBatch.build([ids[:30], ids[30:42]], [0, 0], tables[:2], BLOCK), cache)
    return ForwardBatch.build([ids[42:62], ids[62:63], ids[63:72]], [30, 12, 0], tables, BLOCK)


def _cache(model: DeepseekV3ForCausalLM) -> PagedLatentCache:
    return PagedLatentCache(
        model.num_cache_layers, 16, BLOCK, model.config.latent_dim, torch.float32, "cpu"
    )


def test_rows_as_decodes_place_each_row_at_its_position() -> None:
    batch = ForwardBatch.build([[1, 2, 3], [4], [5, 6]], [10, 4, 0], _tables(), BLOCK)
    rows = batch.rows_as_decodes([0, 2, 3, 5])
    assert rows.seq_lens_q == [1, 1, 1, 1]
    assert rows.context_lens == [11, 13, 5, 2]
    assert rows.block_tables == [_tables()[0], _tables()[0], _tables()[1], _tables()[2]]
    assert rows.input_ids.tolist() == [1, 3, 4, 6]
    assert rows.positions.tolist() == [10, 12, 4, 1]
    assert rows.slot_mapping.tolist() == batch.slot_mapping[[0, 2, 3, 5]].tolist()


def test_the_last_layer_for_the_read_rows_equals_the_whole_step(
    tiny_model: DeepseekV3ForCausalLM,
) -> None:
    full_cache, pruned_cache = _cache(tiny_model), _cache(tiny_model)
    batch = _step(full_cache, tiny_model)
    _step(pruned_cache, tiny_model)
    rows = torch.tensor([5, 19, 20, 29])  # inside the chunk, its last, the decode, the last
    full = tiny_model(batch, full_cache)
    pruned = tiny_model(batch, pruned_cache, rows)
    assert pruned.shape == (4, tiny_model.config.hidden_size)
    torch.testing.assert_close(pruned, full[rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pruned_cache.kv, full_cache.kv)
    assert tiny_model(batch, _cache(tiny_model), torch.tensor([], dtype=torch.long)).shape[0] == 0

    # the MTP layer over the same step: every row's latent cached, the rows' output alone
    next_ids = torch.roll(batch.input_ids, -1)
    shifted = ForwardBatch(
        next_ids, batch.positions, batch.seq_lens_q, batch.context_lens, batch.block_tables,
        batch.slot_mapping,
    )  # fmt: skip
    draft_full = tiny_model.mtp_forward(shifted, full_cache, full)
    draft_rows = tiny_model.mtp_forward(shifted, pruned_cache, full, rows=rows)
    torch.testing.assert_close(draft_rows, draft_full[rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pruned_cache.kv, full_cache.kv)


def test_forward_with_logits_pruned_reads_the_same_logits(
    tiny_model: DeepseekV3ForCausalLM,
) -> None:
    full_cache, pruned_cache = _cache(tiny_model), _cache(tiny_model)
    batch = _step(full_cache, tiny_model)
    _step(pruned_cache, tiny_model)
    rows = batch.last_token_indices()
    hidden, logits = tiny_model.forward_with_logits(batch, full_cache, rows)
    kept, pruned = tiny_model.forward_with_logits(batch, pruned_cache, rows, prune=True)
    assert hidden.shape[0] == batch.num_tokens and kept.shape[0] == rows.numel()
    torch.testing.assert_close(pruned, logits, rtol=1e-5, atol=1e-5)
    assert pruned.argmax(-1).tolist() == logits.argmax(-1).tolist()
