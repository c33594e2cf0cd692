"""The paged MLA latent cache and the flattened batch that one forward step reads.

Per token and layer the cache holds one latent row: the normalized ``c_kv`` (kv_lora_rank values)
followed by the rotated ``k_pe`` (qk_rope_head_dim values). Rows live in fixed-size blocks; a
sequence's block table lists the physical blocks covering its tokens in order, so slot
``block_id * block_size + offset`` holds the token at position ``i * block_size + offset`` when
``block_table[i] == block_id``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class DecodeTensors:
    """A decode batch's attention layout on the device, in the MLA kernel's form, built once a
    step instead of once a layer (and, for a captured graph, kept in static buffers):
    block_tables [S, B] int32 (rows padded with block 0), token_seq [T] int32 (each new token's
    sequence), token_len [T] int32 (the cached rows it sees, its own included) and max_len, a
    bound on token_len known without reading it back from the device."""

    block_tables: Tensor
    token_seq: Tensor
    token_len: Tensor
    max_len: int


@dataclass
class ForwardBatch:
    """One forward step over several sequences, flattened.

    T = total new tokens, S = sequences. Sequences are contiguous in the flat order; the new
    tokens of sequence s are the last ``seq_lens_q[s]`` of its ``context_lens[s]`` cached tokens.
    """

    input_ids: Tensor  # [T] long
    positions: Tensor  # [T] long, absolute position of each new token
    seq_lens_q: list[int]  # [S] new tokens per sequence (sum == T)
    context_lens: list[int]  # [S] tokens in the cache per sequence after this step
    block_tables: list[list[int]]  # [S][*] physical block ids covering context_lens
    slot_mapping: Tensor  # [T] long, flat slot of each new token
    decode: DecodeTensors | None = None  # set only when every sequence brings <= 4 new tokens

    def __post_init__(self) -> None:
        num_tokens = int(self.input_ids.shape[0])
        if sum(self.seq_lens_q) != num_tokens:
            raise ValueError(f"seq_lens_q sums to {sum(self.seq_lens_q)}, batch has {num_tokens}")
        if not len(self.seq_lens_q) == len(self.context_lens) == len(self.block_tables):
            raise ValueError("seq_lens_q, context_lens and block_tables differ in length")
        if self.positions.shape[0] != num_tokens or self.slot_mapping.shape[0] != num_tokens:
            raise ValueError("positions and slot_mapping must have one entry per token")
        for q_len, ctx_len in zip(self.seq_lens_q, self.context_lens, strict=True):
            if q_len < 1 or ctx_len < q_len:
                raise ValueError(f"sequence with {q_len} new tokens and context {ctx_len}")

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_q)

    @property
    def is_decode(self) -> bool:
        """True when every sequence brings exactly one new token."""
        return all(q_len == 1 for q_len in self.seq_lens_q)

    def query_starts(self) -> list[int]:
        """[S + 1]: flat offset of each sequence's first new token, then the total."""
        starts = [0]
        for q_len in self.seq_lens_q:
            starts.append(starts[-1] + q_len)
        return starts

    def last_token_indices(self) -> Tensor:
        """[S] long: flat index of each sequence's last new token (the one that predicts next)."""
        ends = self.query_starts()[1:]
        return torch.tensor(
            [end - 1 for end in ends], dtype=torch.long, device=self.input_ids.device
        )

    def rows_as_decodes(self, rows: list[int]) -> ForwardBatch:
        """The flat rows ``rows`` (increasing) as a batch of one-token sequences: each row's
        token at its position, seeing its sequence's cache up to and including itself (the
        query of a row whose latent this step already wrote)."""
        starts = self.query_starts()
        positions: list[int] = []
        tables: list[list[int]] = []
        seq = 0
        for row in rows:
            while starts[seq + 1] <= row:
                seq += 1
            positions.append(self.context_lens[seq] - self.seq_lens_q[seq] + row - starts[seq])
            tables.append(self.block_tables[seq])
        index = torch.tensor(rows, dtype=torch.long, device=self.input_ids.device)
        return ForwardBatch(
            input_ids=self.input_ids.index_select(0, index),
            positions=self.positions.index_select(0, index),
            seq_lens_q=[1] * len(rows),
            context_lens=[position + 1 for position in positions],
            block_tables=tables,
            slot_mapping=self.slot_mapping.index_select(0, index),
        )

    @staticmethod
    def slots_for(block_table: list[int], start_pos: int, count: int, block_size: int) -> list[int]:
        """Slots of positions ``start_pos .. start_pos + count - 1`` under ``block_table``."""
        needed = -(-(start_pos + count) // block_size)
        if len(block_table) < needed:
            raise ValueError(f"block table has {len(block_table)} blocks, {needed} needed")
        return [
            block_table[pos // block_size] * block_size + pos % block_size
            for pos in range(start_pos, start_pos + count)
        ]

    @classmethod
    def build(
        cls,
        token_ids: list[list[int]],
        start_positions: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> ForwardBatch:
        """Several sequences: sequence s brings ``token_ids[s]`` at ``start_positions[s]...``."""
        flat_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for ids, start, table in zip(token_ids, start_positions, block_tables, strict=True):
            flat_ids.extend(ids)
            positions.extend(range(start, start + len(ids)))
            slots.extend(cls.slots_for(table, start, len(ids), block_size))
        return cls(
            input_ids=torch.tensor(flat_ids, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            seq_lens_q=[len(ids) for ids in token_ids],
            context_lens=[
                start + len(ids) for ids, start in zip(token_ids, start_positions, strict=True)
            ],
            block_tables=[list(table) for table in block_tables],
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        )

    @classmethod
    def for_prefill(
        cls,
        token_ids: list[int],
        start_pos: int,
        block_table: list[int],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> ForwardBatch:
        """One sequence bringing ``token_ids`` at positions ``start_pos, start_pos + 1, ...``."""
        return cls.build([token_ids], [start_pos], [block_table], block_size, device)


class PagedLatentCache:
    """Preallocated latent pool ``kv``: [num_layers, num_blocks * block_size, latent_dim].

    ``num_layers`` counts the decoder layers plus the MTP layers (each has its own cache layer).
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        latent_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if min(num_layers, num_blocks, block_size, latent_dim) < 1:
            raise ValueError("cache dimensions must be positive")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.latent_dim = latent_dim
        self.kv = torch.zeros(
            num_layers, num_blocks * block_size, latent_dim, dtype=dtype, device=device
        )

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, latent_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes one block occupies across all layers."""
        element_size = torch.empty((), dtype=dtype).element_size()
        return num_layers * block_size * latent_dim * element_size

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    def write(self, layer: int, slot_mapping: Tensor, latent: Tensor) -> None:
        """Store ``latent`` [T, latent_dim] at the flat slots ``slot_mapping`` [T]."""
        self.kv[layer].index_copy_(0, slot_mapping, latent.to(self.kv.dtype))

    def gather(self, layer: int, block_table: list[int], length: int) -> Tensor:
        """[length, latent_dim]: the cached rows of positions 0..length-1 in order."""
        needed = -(-length // self.block_size)
        if len(block_table) < needed:
            raise ValueError(f"block table has {len(block_table)} blocks, {needed} needed")
        table = torch.tensor(block_table[:needed], dtype=torch.long, device=self.kv.device)
        blocks = self.kv[layer].view(self.num_blocks, self.block_size, self.latent_dim)
        return blocks.index_select(0, table).reshape(-1, self.latent_dim)[:length]

    def gather_batch(
        self, layer: int, block_tables: list[list[int]], lengths: list[int]
    ) -> tuple[Tensor, Tensor]:
        """Padded latents [S, L_max, latent_dim] and a [S, L_max] bool mask of real rows."""
        for table, length in zip(block_tables, lengths, strict=True):
            if len(table) * self.block_size < length:
                raise ValueError(f"block table of {len(table)} blocks for {length} tokens")
        max_len = max(lengths)
        max_blocks = -(-max_len // self.block_size)
        padded = [
            table[:max_blocks] + [0] * (max_blocks - len(table[:max_blocks]))
            for table in block_tables
        ]
        device = self.kv.device
        tables = torch.tensor(padded, dtype=torch.long, device=device)  # [S, max_blocks]
        positions = torch.arange(max_len, dtype=torch.long, device=device)
        slots = (
            tables[:, positions // self.block_size] * self.block_size + positions % self.block_size
        )
        valid = positions[None, :] < torch.tensor(lengths, device=device)[:, None]
        latents = self.kv[layer].index_select(0, slots.reshape(-1))
        return latents.view(len(lengths), max_len, self.latent_dim), valid
