"""A scheduled step as the model's flat batch: ids, positions and cache slots of every new
token, and, on CUDA for short queries, the attention kernel's layout made once a step."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.engine.scheduler import ScheduledSeq
from backend.kernels.mla_decode import block_table_tensor, token_layout
from backend.model.cache import DecodeTensors, ForwardBatch
from backend.model.mla import MAX_SHORT_QUERY


def build_batch(
    scheduled: Sequence[ScheduledSeq], block_size: int, device: torch.device
) -> ForwardBatch:
    """The step's flat batch: ids, positions and slots of every new token, once per step."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seq_lens_q: list[int] = []
    context_lens: list[int] = []
    block_tables: list[list[int]] = []
    for item in scheduled:
        seq, start = item.seq, item.start
        end = start + item.num_new_tokens + item.num_lookahead
        input_ids.extend(seq.token_ids[start : start + item.num_new_tokens])
        input_ids.extend(item.draft_token_ids)
        positions.extend(range(start, end))
        _extend_slots(slots, seq.block_table, start, end, block_size)
        seq_lens_q.append(end - start)
        context_lens.append(end)
        # read during this step only; the scheduler changes tables between steps
        block_tables.append(seq.block_table)
    decode = None
    if device.type == "cuda" and max(seq_lens_q) <= MAX_SHORT_QUERY:
        # the attention kernel's layout, made once a step instead of once a layer
        token_seq, token_len = token_layout(seq_lens_q, context_lens, device)
        tables = block_table_tensor(block_tables, device)
        decode = DecodeTensors(tables, token_seq, token_len, max(context_lens))
    return ForwardBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        seq_lens_q=seq_lens_q,
        context_lens=context_lens,
        block_tables=block_tables,
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        decode=decode,
    )


def _extend_slots(
    slots: list[int], block_table: list[int], start: int, end: int, size: int
) -> None:
    """Append the flat slots of positions [start, end), one run per block touched."""
    position = start
    while position < end:
        block, offset = divmod(position, size)
        run = min(end, (block + 1) * size) - position
        first = block_table[block] * size + offset
        slots.extend(range(first, first + run))
        position += run
