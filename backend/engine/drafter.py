"""MTP drafting: after the target's forward, the MTP layer proposes each sequence's next tokens.

The MTP layer runs on every position the target computed in the step (prefill chunks and
verified decodes alike), so its latent cache layer, in the same paged pool and block tables as
the target's, is filled wherever the target's is. Its input at position t is the target's final
hidden state at t and the embedding of token t + 1 (known from the prompt, or just emitted); at
the position before a sequence's last token it proposes the first draft (in a step with a
prefill chunk the layer's attention and MLP run at those rows alone: only their output is read).
Deeper drafts feed the
layer its own output: draft j comes from position P + j - 2 (P: the last token's position), over
slots the scheduler reserved, and its latents there are overwritten when the target verifies.

Greedy requests draft the argmax. Sampled requests draw from the draft distribution q (the
request's own temperature and truncation applied to the MTP logits, penalties left out) with the
request's generator; q is returned for the rejection test of the next step.

The draft vocabulary is the rows of the MTP head that are not all zero: every row of a real
checkpoint; the trained demo checkpoint zeroes the rows its corpus never uses, and its vocabulary
projection (129,280 rows) would otherwise cost as much as the small model's whole step. Any
proposal keeps verification exact (greedy checks the target's argmax, rejection sampling uses
the q actually drawn from), so a smaller draft vocabulary only changes which drafts are made.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from backend.engine.sampler import Sampler, SampleRow, draw
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.layers import project_rows
from backend.model.model import DeepseekV3ForCausalLM, MTPLayer


@dataclass(frozen=True, slots=True)
class DraftTarget:
    """One sequence to draft for: `row` is the flat batch row at position `position - 1`, where
    `position` holds its last (just emitted) token; `max_depth` drafts at most."""

    row: int
    position: int
    block_table: list[int]
    sample_row: SampleRow
    max_depth: int

    @property
    def greedy(self) -> bool:
        return self.sample_row.params.temperature == 0


@dataclass(frozen=True, slots=True)
class Drafts:
    """Per target: its draft tokens and, for a sampled request, q [len(tokens), V] (else None)."""

    tokens: list[list[int]]
    probs: list[Tensor | None]


class Drafter:
    """Runs the MTP layer over a step's positions and proposes drafts."""

    def __init__(
        self, model: DeepseekV3ForCausalLM, cache: PagedLatentCache, sampler: Sampler
    ) -> None:
        if model.num_mtp_layers < 1:
            raise ValueError("the model has no MTP layer to draft with")
        self.model = model
        self.cache = cache
        self.sampler = sampler
        layer = model.model.layers[model.config.num_hidden_layers]
        assert isinstance(layer, MTPLayer)
        head = layer.shared_head.head.weight  # [V, D]
        used = head.abs().sum(dim=-1) > 0
        self.vocab: Tensor | None = None  # ids of the draft vocabulary when not all rows
        self.head = head
        if not bool(used.all()):
            self.vocab = used.nonzero().flatten()
            self.head = head[self.vocab].contiguous()  # [U, D]

    def draft(
        self, batch: ForwardBatch, hidden: Tensor, next_ids: list[int], targets: list[DraftTarget]
    ) -> Drafts:
        """batch: the target's step; hidden [T, D] its final hidden states; next_ids [T] the token
        after each row's position (any id where that token is not known: the latent written
        there is replaced before it is read)."""
        model = self.model
        inputs = torch.tensor(next_ids, dtype=torch.long, device=hidden.device)
        tokens: list[list[int]] = [[] for _ in targets]
        probs: list[list[Tensor]] = [[] for _ in targets]
        live = [i for i, t in enumerate(targets) if t.max_depth > 0]
        live.sort(key=lambda i: targets[i].row)
        rows = torch.tensor([targets[i].row for i in live], dtype=torch.long, device=hidden.device)
        # every row's latent is cached; the layer's output is computed where a draft starts
        previous = model.mtp_forward(
            replace(batch, input_ids=inputs), self.cache, hidden, rows=rows
        )  # [N, D]
        if not live:
            return Drafts(tokens, [None] * len(targets))
        depth = 1
        while True:
            proposed = self._propose(previous, [targets[i] for i in live])
            for j, i in enumerate(live):
                tokens[i].append(proposed[0][j])
                q = proposed[1][j]
                if q is not None:
                    probs[i].append(q)
            keep = [j for j, i in enumerate(live) if targets[i].max_depth > depth]
            if not keep:
                break
            live = [live[j] for j in keep]
            previous = previous[torch.tensor(keep, dtype=torch.long, device=hidden.device)]
            block_size = self.cache.block_size
            chained = ForwardBatch.build(
                [[tokens[i][-1]] for i in live],
                [targets[i].position + depth - 1 for i in live],
                [targets[i].block_table for i in live],
                block_size,
                hidden.device,
            )
            previous = model.mtp_forward(chained, self.cache, previous)
            depth += 1
        return Drafts(tokens, [torch.stack(p) if p else None for p in probs])

    def _propose(
        self, hidden: Tensor, targets: list[DraftTarget]
    ) -> tuple[list[int], list[Tensor | None]]:
        """hidden [N, D] MTP outputs -> one draft token per target, and q for sampled ones."""
        logits = project_rows(hidden, self.head).float()  # [N, U] draft vocabulary
        rows = [_without_penalties(t.sample_row) for t in targets]
        token_ids = logits.argmax(dim=-1)
        probs: list[Tensor | None] = [None] * len(targets)
        sampled = [j for j, t in enumerate(targets) if not t.greedy]
        if sampled:
            index = torch.tensor(sampled, dtype=torch.long, device=logits.device)
            q = self.sampler.probs(logits[index], [rows[j] for j in sampled])
            token_ids[index] = draw(q, [rows[j].generator for j in sampled])
            if self.vocab is not None:  # back to the whole vocabulary
                full = q.new_zeros(q.shape[0], self.model.config.vocab_size)
                q = full.index_copy_(1, self.vocab, q)
            for k, j in enumerate(sampled):
                probs[j] = q[k]
        if self.vocab is not None:
            token_ids = self.vocab[token_ids]
        return token_ids.tolist(), probs


def _without_penalties(row: SampleRow) -> SampleRow:
    """The draft proposal ignores penalties (any proposal keeps verification exact)."""
    if not row.params.has_penalties:
        return row
    params = replace(row.params, presence_penalty=0.0, frequency_penalty=0.0)
    return replace(row, params=replace(params, repetition_penalty=1.0))
