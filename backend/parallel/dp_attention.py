"""Data-parallel attention: every rank holds the attention whole and attends only to its own
sequences, whose latents live in its own pool.

Rank 0's block pools (``backend.engine.ranked_blocks``) number rank r's blocks from
r x ``stride``, so the step's plan, which every rank receives whole, tells each rank its share:
the sequences whose block tables point into its pool. A rank picks their rows of the
replicated hidden states [T, D], runs MLA over them with its pool's own block ids and slots,
and the ranks' output rows are joined into the replicated [T, D] by an all-gather: each rank's
rows padded to the busiest rank's B, [N, B, D] gathered, then every row taken from its rank.
Where shares are so uneven that the padding costs more than a ring all-reduce
(``backend.parallel.sizing.gather_is_cheaper``: N x B >= 2 T), each rank puts its rows into a
zero [T, D] and an all-reduce adds them instead (each row from one rank, the others add zeros).
Both are exact, and every rank makes the same choice from the plan. A rank without sequences
in a step computes nothing and still joins the collective (and the MoE exchanges after it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.config import ModelConfig
from backend.model.mla import MLA
from backend.parallel.group import RankGroup
from backend.parallel.layers import latent_bytes
from backend.parallel.sizing import gather_is_cheaper


@dataclass(frozen=True)
class Share:
    """A rank's part of a step: the rows [T_r] (long) of its sequences' new tokens in the
    step's flat order, and those sequences as a batch over its own pool (None: no sequence);
    ``busiest``: the most rows any rank has in the step; ``gather_index`` [T] (long): where
    each row of the step sits in the all-gathered [N x busiest] rows (None: the step's rows
    join by all-reduce)."""

    rows: Tensor
    batch: ForwardBatch | None
    busiest: int
    gather_index: Tensor | None


class AttentionShares:
    """Splits each step by rank (``stride``: blocks numbered per rank, set once the pool size
    is known); the last step's split is kept, since every layer asks for it."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank = rank
        self.world = world
        self.stride = 0
        self._last: tuple[ForwardBatch, Share] | None = None

    def share(self, batch: ForwardBatch, block_size: int) -> Share:
        last = self._last
        if last is not None and last[0] is batch:
            return last[1]
        share = self._split(batch, block_size)
        self._last = (batch, share)
        return share

    def _split(self, batch: ForwardBatch, block_size: int) -> Share:
        if self.stride < 1:
            raise RuntimeError("the attention pools' stride is not set")
        stride, rank = self.stride, self.rank
        first, limit = rank * stride, (rank + 1) * stride
        starts = batch.query_starts()
        seqs: list[int] = []
        owners: list[int] = []
        for seq, table in enumerate(batch.block_tables):
            if not table:
                raise ValueError(f"sequence {seq} of the step holds no block")
            owner = table[0] // stride
            if owner >= self.world:
                raise ValueError(f"block {table[0]} is past the {self.world} ranks' pools")
            owners.append(owner)
            if owner == rank:
                seqs.append(seq)
        counts = [0] * self.world
        for seq, owner in enumerate(owners):
            counts[owner] += starts[seq + 1] - starts[seq]
        busiest = max(counts)
        device = batch.input_ids.device
        gather_index = None
        if gather_is_cheaper(starts[-1], busiest, self.world):
            taken = [0] * self.world
            index: list[int] = []
            for seq, owner in enumerate(owners):
                n = starts[seq + 1] - starts[seq]
                index.extend(
                    range(owner * busiest + taken[owner], owner * busiest + taken[owner] + n)
                )
                taken[owner] += n
            gather_index = torch.tensor(index, dtype=torch.long, device=device)
        rows = torch.tensor(
            [row for s in seqs for row in range(starts[s], starts[s + 1])],
            dtype=torch.long,
            device=device,
        )
        if not seqs:
            return Share(rows, None, busiest, gather_index)
        tables = []
        for s in seqs:
            table = batch.block_tables[s]
            if not all(first <= block < limit for block in table):
                raise ValueError(f"sequence {s}'s blocks span several ranks' pools")
            tables.append([block - first for block in table])
        local = ForwardBatch(
            input_ids=batch.input_ids.index_select(0, rows),
            positions=batch.positions.index_select(0, rows),
            seq_lens_q=[batch.seq_lens_q[s] for s in seqs],
            context_lens=[batch.context_lens[s] for s in seqs],
            block_tables=tables,
            slot_mapping=batch.slot_mapping.index_select(0, rows) - first * block_size,
        )
        return Share(rows, local, busiest, gather_index)


class DataParallelMLA(MLA):
    """MLA with every head over this rank's sequences (``shares``); the ranks' output rows
    join in one all-gather (or, for very uneven shares, one all-reduce) into [T, D]."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, group: RankGroup, shares: AttentionShares
    ) -> None:
        super().__init__(config, dtype)
        self.group = group
        self.shares = shares
        self.latent_bytes_read = 0  # cached latents this rank's attention read (benchmarks)
        self.seconds = 0.0  # wall time of its attention before the all-reduce (benchmarks)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        batch: ForwardBatch,
        cache: PagedLatentCache,
        cache_layer: int,
        rows: list[int] | None = None,
    ) -> Tensor:  # x: [T, D] (every rank's the same) -> [T, D]
        if rows is not None:
            raise ValueError("data-parallel attention computes every row of a step")
        started = time.perf_counter()
        share = self.shares.share(batch, cache.block_size)
        gathering = share.gather_index is not None
        out = x.new_zeros((share.busiest if gathering else x.shape[0], x.shape[1]))
        if share.batch is not None:
            self.latent_bytes_read += latent_bytes(share.batch, cache)
            mine = share.rows
            local = super().forward(
                x.index_select(0, mine),
                cos.index_select(0, mine),
                sin.index_select(0, mine),
                share.batch,
                cache,
                cache_layer,
            )  # [T_r, D]
            if gathering:
                out[: local.shape[0]] = local
            else:
                out.index_copy_(0, mine, local)
        self.seconds += time.perf_counter() - started
        if share.gather_index is None:
            return self.group.all_reduce(out)
        gathered = self.group.all_gather(out)  # [N, busiest, D]
        return gathered.view(-1, x.shape[1]).index_select(0, share.gather_index)
