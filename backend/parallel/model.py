"""The sharded network and the per-step protocol between rank 0 and the worker ranks.

Rank 0's runner and drafter call the model as on one device. Each entry point first sends the
worker ranks one command: a 3-value header [kind, plan length, rows] and the plan, one int64
tensor. A step (``forward_with_logits``, STEP) sends its plan once: the step's token ids,
positions, slots, new tokens and context per sequence, block tables, then the numbers of the
rows whose logits are sampled (every rank holds the forward's output). Drafting over the same
step (``mtp_forward`` on the step's batch and output, MTP_NEXT) sends only what sampling decided:
the next token id of each row. Other calls (a bare ``forward``, ``compute_logits`` of other
rows, a chained draft) send their own plan and, where the workers cannot know them, the hidden
rows [N, D] they read.
Then every rank runs the same forward over its shard; the collectives inside the layers keep
them in step. Workers answer nothing: the logits come back to rank 0 in the output head's
gather. A collective that fails or times out raises ``RankFailure``; rank 0 names the ranks
that stopped (``on_failure``) and the engine goes down.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import torch
from torch import Tensor, nn

from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.config import ModelConfig
from backend.model.layers import Linear
from backend.model.model import DecoderLayer, DeepseekV3ForCausalLM, MTPLayer
from backend.parallel.dp_attention import AttentionShares, DataParallelMLA
from backend.parallel.group import RankFailure, RankGroup
from backend.parallel.layers import (
    ParallelMLA,
    ParallelMoE,
    ParallelSwiGLU,
    VocabParallelEmbedding,
    local_heads_config,
)
from backend.parallel.layout import Layout

logger = logging.getLogger(__name__)

FORWARD, LOGITS, MTP, SHUTDOWN, STEP, MTP_NEXT, COUNTERS = 1, 2, 3, 4, 5, 6, 7
_T = TypeVar("_T")
_LAST_HIDDEN = -1  # hidden rows header: the MTP input is the last forward's output


class ShardedCausalLM(DeepseekV3ForCausalLM):
    """``DeepseekV3ForCausalLM`` with this rank's shard of every layer. ``config`` stays the
    whole model's (the runner sizes the cache and the vocabulary from it)."""

    def __init__(
        self,
        config: ModelConfig,
        layout: Layout,
        group: RankGroup,
        *,
        dtype: torch.dtype = torch.float32,
        include_mtp: bool = True,
    ) -> None:
        super().__init__(config, dtype=dtype, include_mtp=include_mtp)
        layout.check(config)
        self.layout = layout
        self.group = group
        self.on_failure: Callable[[RankFailure], RankFailure] | None = None
        self.on_close: Callable[[], None] | None = None  # rank 0: stop the local workers
        self._last_hidden: Tensor | None = None
        self._last_batch: ForwardBatch | None = None  # the batch of that forward
        self.commands_sent: Counter[int] = Counter()  # rank 0: commands sent, by kind
        dim = config.hidden_size
        start, stop = layout.vocab_range(config.vocab_size)
        share = layout.vocab_share(config.vocab_size)
        self.model.embed_tokens = VocabParallelEmbedding(share, dim, start, dtype, group)  # type: ignore[assignment]
        self.vocab_rows = stop - start  # real rows of the local share (the rest is padding)
        self.lm_head = Linear(dim, share, bias=False, dtype=dtype)
        heads = local_heads_config(config, layout)
        self.attention_shares: AttentionShares | None = None
        if layout.data_parallel_attention:
            self.attention_shares = AttentionShares(layout.rank, layout.world)
            self.attention_ranks = layout.world
        for index, layer in enumerate(self.model.layers):
            assert isinstance(layer, DecoderLayer)
            if self.attention_shares is not None:
                layer.self_attn = DataParallelMLA(config, dtype, group, self.attention_shares)
            else:
                layer.self_attn = ParallelMLA(heads, dtype, group)
            if config.is_moe_layer(index):
                layer.mlp = ParallelMoE(config, dtype, group, layout)
            else:
                hidden = config.intermediate_size // layout.world
                layer.mlp = ParallelSwiGLU(dim, hidden, dtype, group)
            if isinstance(layer, MTPLayer) and layout.rank != 0:
                head = Linear(dim, 1, bias=False, dtype=dtype)  # then no rows: only rank 0 drafts
                head.weight = nn.Parameter(torch.empty(0, dim, dtype=dtype))
                head.out_features = 0
                layer.shared_head.head = head

    def set_attention_pools(self, blocks_per_rank: int) -> None:
        """With data-parallel attention: each rank's pool holds ``blocks_per_rank`` blocks,
        rank r's numbered from r x ``blocks_per_rank`` (the stride of rank 0's pools)."""
        if self.attention_shares is not None:
            self.attention_shares.stride = blocks_per_rank
            self.attention_pool_stride = blocks_per_rank

    # Rank 0 sends each call to the workers first.

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, cache: PagedLatentCache, rows: Tensor | None = None
    ) -> Tensor:
        """Every rank computes every row; ``rows`` narrows only what rank 0 returns."""
        self._send(FORWARD, lambda: encode_plan(batch), None)
        hidden = self._forward(batch, cache)
        return hidden if rows is None else hidden.index_select(0, rows)

    @torch.inference_mode()
    def forward_with_logits(
        self, batch: ForwardBatch, cache: PagedLatentCache, rows: Tensor, *, prune: bool = False
    ) -> tuple[Tensor, Tensor]:
        """One command: the plan and the sampled rows' numbers (``rows`` [R]). Every rank
        computes every row (``prune`` only narrows the hidden states returned to ``rows``')."""
        self._send(
            STEP, lambda: torch.cat((encode_plan(batch), rows.cpu())), None, extra=rows.numel()
        )
        hidden = self._forward(batch, cache)
        picked = hidden.index_select(0, rows)
        logits = self._guard(lambda: self._gather_logits(picked))
        return (picked if prune else hidden), logits

    def _forward(self, batch: ForwardBatch, cache: PagedLatentCache) -> Tensor:
        hidden = self._guard(lambda: DeepseekV3ForCausalLM.forward(self, batch, cache))
        self._last_hidden, self._last_batch = hidden, batch
        return hidden

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """[N, D] -> [N, vocab] fp32 at rank 0 (the vocabulary shares gathered); workers get
        an empty tensor."""
        self._send(LOGITS, None, hidden)
        return self._guard(lambda: self._gather_logits(hidden))

    def _gather_logits(self, hidden: Tensor) -> Tensor:
        local = self.lm_head(hidden).float()  # [N, share]
        parts = self.group.gather_to_root(local)
        if parts is None:
            return local.new_empty(0)
        return torch.cat(parts, dim=-1)[:, : self.config.vocab_size]

    @torch.inference_mode()
    def mtp_forward(
        self,
        batch: ForwardBatch,
        cache: PagedLatentCache,
        previous_hidden: Tensor,
        depth: int = 0,
        rows: Tensor | None = None,
    ) -> Tensor:
        """Every rank computes every row; ``rows`` narrows only what rank 0 returns."""
        if depth:
            raise ValueError("the parallel engine runs one MTP layer")
        if self._drafts_over_last_step(batch, previous_hidden):
            self._send(MTP_NEXT, batch.input_ids.cpu, None)
        else:
            self._send(MTP, lambda: encode_plan(batch), previous_hidden)
        out = self._guard(
            lambda: DeepseekV3ForCausalLM.mtp_forward(self, batch, cache, previous_hidden)
        )
        return out if rows is None else out.index_select(0, rows)

    @torch.inference_mode()
    def rank_counters(self) -> list[RankCounters]:
        """Every rank's counters so far, at rank 0 (one command and one all-reduce; workers
        answer it in ``serve``)."""
        self._send(COUNTERS, None, None)
        return self._guard(self._all_counters)

    def _all_counters(self) -> list[RankCounters]:
        group = self.group
        attention = [layer.self_attn for layer in self.model.layers]
        read = sum(getattr(each, "latent_bytes_read", 0) for each in attention)
        seconds = sum(getattr(each, "seconds", 0.0) for each in attention)
        table = torch.zeros(group.world, 4, dtype=torch.float64)
        table[group.rank] = torch.tensor([group.bytes_sent, group.seconds, read, seconds])
        group.all_reduce(table)
        return [
            RankCounters(r, int(b), s, int(a), t) for r, (b, s, a, t) in enumerate(table.tolist())
        ]

    def close(self) -> None:
        """Rank 0: tell the workers to exit, then drop the group (best effort: a failed
        group is dropped all the same)."""
        if self.group.is_root and not self.group.broken:
            try:
                self.group.broadcast(torch.tensor([SHUTDOWN, 0, 0], dtype=torch.long))
            except RankFailure as exc:
                logger.warning("parallel engine shutdown: %s", exc)
        self.group.shutdown()
        if self.on_close is not None:
            self.on_close()

    def _guard(self, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except RankFailure as exc:
            if self.group.is_root and self.on_failure is not None:
                raise self.on_failure(exc) from exc
            raise

    def _drafts_over_last_step(self, batch: ForwardBatch, hidden: Tensor) -> bool:
        """The drafter's first MTP pass: the last step's batch with other token ids, over that
        step's output (the workers hold both)."""
        last = self._last_batch
        return (
            last is not None
            and hidden is self._last_hidden
            and batch.positions is last.positions
            and batch.slot_mapping is last.slot_mapping
            and batch.block_tables is last.block_tables
        )

    def _send(
        self,
        kind: int,
        make_plan: Callable[[], Tensor] | None,
        hidden: Tensor | None,
        extra: int = 0,
    ) -> None:
        """Rank 0: the command header, the plan (int64, made here) and the hidden rows the
        workers need (the header's third value: those rows' count, or ``extra`` where no rows
        go). Other ranks send nothing."""
        if not self.group.is_root or self.layout.world == 1:
            return
        plan = make_plan() if make_plan is not None else None
        rows = extra
        if hidden is not None:
            rows = _LAST_HIDDEN if hidden is self._last_hidden else int(hidden.shape[0])
        header = torch.tensor([kind, 0 if plan is None else plan.numel(), rows], dtype=torch.long)

        def send() -> Tensor:
            self.group.broadcast(header)
            if plan is not None:
                self.group.broadcast(plan)
            if hidden is not None and rows != _LAST_HIDDEN:
                self.group.broadcast(hidden.contiguous())
            return header

        self._guard(send)
        self.commands_sent[kind] += 1

    # Worker ranks.

    @torch.inference_mode()
    def serve(self, cache: PagedLatentCache) -> None:
        """A worker's loop: run each of rank 0's commands until SHUTDOWN. Raises RankFailure
        when the group fails (rank 0 gone, or a collective timed out)."""
        group, device = self.group, self.device
        while True:
            header = group.broadcast(torch.zeros(3, dtype=torch.long), idle=True)
            kind, plan_len, rows = header.tolist()
            if kind == SHUTDOWN:
                return
            plan = None
            if plan_len:
                plan = group.broadcast(torch.empty(plan_len, dtype=torch.long))
            last, last_hidden = self._last_batch, self._last_hidden
            if kind == STEP and plan is not None and 0 <= rows < plan_len:
                out = self._forward(decode_plan(plan[: plan_len - rows], device), cache)
                self._gather_logits(out.index_select(0, plan[plan_len - rows :].to(device)))
            elif kind == COUNTERS:
                self._all_counters()
            elif (
                kind == MTP_NEXT
                and plan is not None
                and last is not None
                and last_hidden is not None
            ):
                self.mtp_forward(replace(last, input_ids=plan.to(device)), cache, last_hidden)
            else:
                self._serve_call(header, plan, cache)

    def _serve_call(self, header: Tensor, plan: Tensor | None, cache: PagedLatentCache) -> None:
        """A worker: a call that brings its own plan and hidden rows (a bare forward, logits of
        given rows, a chained draft)."""
        kind, _, rows = header.tolist()
        hidden = None
        if rows > 0:
            shape = (rows, self.config.hidden_size)
            hidden = self.group.broadcast(torch.empty(shape, dtype=self.dtype, device=self.device))
        elif rows == _LAST_HIDDEN:
            hidden = self._last_hidden
        if kind == FORWARD and plan is not None:
            self._forward(decode_plan(plan, self.device), cache)
        elif kind == LOGITS and hidden is not None:
            self.compute_logits(hidden)
        elif kind == MTP and plan is not None and hidden is not None:
            self.mtp_forward(decode_plan(plan, self.device), cache, hidden)
        else:
            raise RankFailure(f"rank {self.group.rank}: malformed command {header.tolist()}")


@dataclass(frozen=True)
class RankCounters:
    """What rank ``rank`` did so far: payload bytes it put into collectives, seconds inside
    them (waiting for slower ranks included), bytes of cached latents its attention read and
    the wall time of its attention layers (host time: on a GPU, the kernels' launch)."""

    rank: int
    bytes_sent: int
    collective_seconds: float
    latent_bytes_read: int
    attention_seconds: float


def encode_plan(batch: ForwardBatch) -> Tensor:
    """One int64 tensor: [T, S, ids(T), positions(T), slots(T), seq_lens_q(S), context_lens(S),
    table lengths(S), the tables back to back]."""
    tables = batch.block_tables
    head = [batch.num_tokens, batch.num_seqs]
    lists = [
        batch.seq_lens_q,
        batch.context_lens,
        [len(t) for t in tables],
        [b for t in tables for b in t],
    ]
    flat = torch.tensor(head + [v for part in lists for v in part], dtype=torch.long)
    tensors = (batch.input_ids.cpu(), batch.positions.cpu(), batch.slot_mapping.cpu())
    return torch.cat((flat[:2], *tensors, flat[2:]))


def decode_plan(plan: Tensor, device: torch.device | str = "cpu") -> ForwardBatch:
    """``encode_plan``'s inverse."""
    num_tokens, num_seqs = plan[:2].tolist()
    at = 2
    ids, positions, slots = (
        plan[at + i * num_tokens : at + (i + 1) * num_tokens] for i in range(3)
    )
    at += 3 * num_tokens
    rest = plan[at:].tolist()
    seq_lens_q = rest[:num_seqs]
    context_lens = rest[num_seqs : 2 * num_seqs]
    table_lens = rest[2 * num_seqs : 3 * num_seqs]
    flat_tables = rest[3 * num_seqs :]
    tables: list[list[int]] = []
    offset = 0
    for length in table_lens:
        tables.append(flat_tables[offset : offset + length])
        offset += length
    return ForwardBatch(
        input_ids=ids.to(device),
        positions=positions.to(device),
        seq_lens_q=seq_lens_q,
        context_lens=context_lens,
        block_tables=tables,
        slot_mapping=slots.to(device),
    )


def num_parameters_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
