"""Turns one scheduled step into one forward pass over the paged latent pool, then samples.

The runner owns every tensor of the engine: the latent pool (allocated once, sized by the
memory budget), each step's flattened batch, the logits and the per-request random generators.
The model's attention reads the batch and the pool only through ``ForwardBatch`` and
``PagedLatentCache``, so a GPU attention kernel plugs in behind the model without touching this
file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from backend.engine.drafter import Drafter, DraftTarget
from backend.engine.engine_config import EngineConfig, cache_bytes_per_block
from backend.engine.grammar import GrammarMasks, GrammarRow
from backend.engine.graph_runner import (
    DecodeBuffers,
    DecodeGraphRunner,
    GraphReport,
    bucket_sizes,
    graph_modes,
    num_pad_blocks,
)
from backend.engine.request import Request
from backend.engine.sampler import (
    Sampler,
    SampleRow,
    TokenLogprobs,
    apply_penalties,
    make_generator,
    with_drafts,
)
from backend.engine.scheduler import ScheduledSeq, SchedulerOutput
from backend.engine.spec_decode import greedy_verify, rejection_sample
from backend.engine.step_batch import build_batch
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.model import DeepseekV3ForCausalLM

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SpecStepStats:
    """One step's speculation: drafts verified and accepted, sequences that verified drafts,
    drafts proposed for the next step, and seconds spent in the MTP layer."""

    num_verified: int = 0
    num_accepted: int = 0
    num_verifications: int = 0
    num_proposed: int = 0
    draft_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class RunnerOutput:
    """Per scheduled sequence, in the scheduler's order: the tokens it emits (empty for a
    prefill chunk that does not reach the sequence's last token; else its accepted drafts and
    one sampled token), their logprobs (None where the request did not ask for them or nothing
    was sampled) and the drafts proposed for its next step (empty when none)."""

    sampled_tokens: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None]
    draft_tokens: list[list[int]] = field(default_factory=list)
    spec: SpecStepStats = SpecStepStats()


class ModelRunner:
    """Runs the model for the scheduler: one ``ForwardBatch`` and one forward per step.

    Decodes, their draft tokens and prefill chunks share the step. Logits are computed only for
    rows that sample: the last new token of a sequence whose step reaches its last token, and
    each draft after it. When the step drafts (``SchedulerOutput.num_spec_tokens``), the MTP
    layer then runs over the step's positions and proposes the next drafts. A seeded request
    draws from its own generator, kept from its first sample until `release`, so its samples do
    not depend on what else is batched with it (and survive preemption); a sampled request's
    draft distribution is kept until its drafts are verified.
    """

    def __init__(self, model: DeepseekV3ForCausalLM, config: EngineConfig, num_blocks: int) -> None:
        if model.dtype != config.torch_dtype:
            raise ValueError(f"model is {model.dtype}, the engine config says {config.dtype}")
        device = config.resolved_device()
        if model.device.type != torch.device(device).type:
            raise ValueError(f"model is on {model.device}, the engine config says {device}")
        self.model = model
        self.block_size = config.block_size
        self.device = model.device
        mtp = model.num_mtp_layers > 0
        self.num_blocks = num_blocks
        self._pad_decodes, self._capture_graphs = graph_modes(config, self.device)
        # padded decode steps write and read only these blocks, past the block manager's
        num_pad = num_pad_blocks(config.block_size) if self._pad_decodes else 0
        self.pad_blocks = list(range(num_blocks, num_blocks + num_pad))
        self.graphs: DecodeGraphRunner | None = None
        self.cache = PagedLatentCache(
            num_layers=model.num_cache_layers,
            num_blocks=self.num_blocks + num_pad,
            block_size=config.block_size,
            latent_dim=model.config.latent_dim,
            dtype=config.torch_dtype,
            device=self.device,
        )
        self.sampler = Sampler()
        self.drafter = Drafter(model, self.cache, self.sampler) if mtp else None
        self._generators: dict[str, torch.Generator] = {}
        self._draft_probs: dict[str, torch.Tensor] = {}
        self.grammar = GrammarMasks()
        pool = {
            "kv_blocks": self.num_blocks,
            "block_size": self.block_size,
            "kv_tokens": self.num_blocks * self.block_size,
            "cache_layers": model.num_cache_layers,
            "kv_mib": round(
                self.num_blocks * cache_bytes_per_block(config, model.config, mtp=mtp) / 2**20, 1
            ),
            "device": str(self.device),
            "dtype": config.dtype,
        }
        logger.info("latent pool: %s", " ".join(f"{k}={v}" for k, v in pool.items()), extra=pool)

    def setup_decode_graphs(
        self, config: EngineConfig, max_context: int, num_spec_tokens: int
    ) -> GraphReport | None:
        """Static buffers for decode steps padded to their batch bucket (sequences of up to
        ``max_context`` tokens, drafts included), captured as CUDA graphs on a GPU; None when
        this engine runs every step eagerly."""
        if not self._pad_decodes:
            return None
        buckets = bucket_sizes(config.decode_graph_max_batch, config.max_num_seqs)
        q_lens = (1, 1 + num_spec_tokens) if num_spec_tokens else (1,)
        buffers = DecodeBuffers(
            max_seqs=buckets[-1],
            max_q=max(q_lens),
            max_blocks=-(-max_context // self.block_size),
            block_size=self.block_size,
            pad_blocks=self.pad_blocks,
            max_len=max_context,
            device=self.device,
        )
        self.graphs = DecodeGraphRunner(
            self.model, self.cache, buffers, buckets, q_lens, capture=self._capture_graphs
        )
        report = self.graphs.capture()
        fields = report.log_fields()
        logger.info("decode graphs: %s", " ".join(f"{k}={v}" for k, v in fields.items()),
                    extra=fields)  # fmt: skip
        return report

    @property
    def num_tokens_capacity(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def can_draft(self) -> bool:
        return self.drafter is not None

    def execute(self, output: SchedulerOutput) -> RunnerOutput:
        """Run one step; the model writes the new tokens' (and drafts') latents into their
        slots, and with drafting the MTP layer's too."""
        scheduled = output.scheduled
        if not scheduled:
            return RunnerOutput([], [])
        if output.num_spec_tokens and self.drafter is None:
            raise ValueError("this model has no MTP layer to draft with")
        batch = build_batch(scheduled, self.block_size, self.device)
        # per sampling sequence: its rows, the last new token then each draft
        first_rows: list[int] = []
        row = 0
        for item in scheduled:
            row += item.num_new_tokens
            if item.samples:
                first_rows.append(row - 1)
            row += item.num_lookahead
        samplers = [item for item in scheduled if item.samples]
        sampled_tokens: list[list[int]] = [[] for _ in scheduled]
        logprobs: list[list[TokenLogprobs] | None] = [None] * len(scheduled)
        with torch.inference_mode():
            if samplers:
                rows, sample_rows = self._rows_to_sample(samplers, first_rows)
                hidden, logits = self._forward_with_logits(
                    batch, rows, prune=not output.num_spec_tokens
                )
                emitted, emitted_logprobs, verify = self._sample(logits, samplers, sample_rows)
                position = 0
                for i, item in enumerate(scheduled):
                    if item.samples:
                        sampled_tokens[i] = emitted[position]
                        logprobs[i] = emitted_logprobs[position]
                        position += 1
            elif output.num_spec_tokens:
                hidden = self.model(batch, self.cache)  # [T, D]
                verify = SpecStepStats()
            else:  # a prefill chunk that samples nothing: its latents are all it leaves
                empty = torch.empty(0, dtype=torch.long, device=self.device)
                hidden = self.model(batch, self.cache, empty)
                verify = SpecStepStats()
            if not output.num_spec_tokens:
                return RunnerOutput(sampled_tokens, logprobs, [[] for _ in scheduled], verify)
            started = time.perf_counter()
            drafts = self._draft(batch, hidden, scheduled, sampled_tokens, output.num_spec_tokens)
            spec = replace(
                verify,
                num_proposed=sum(len(d) for d in drafts),
                draft_seconds=time.perf_counter() - started,
            )
        return RunnerOutput(sampled_tokens, logprobs, drafts, spec)

    def _forward_with_logits(
        self, batch: ForwardBatch, rows: torch.Tensor, prune: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, D] and the logits [R, vocab] of ``rows``: a decode step padded to its
        bucket (replayed from its graph where captured), any other step eagerly; with
        ``prune`` (no drafting reads the hidden states) a prefill step's last layer computes
        only ``rows``."""
        if self.graphs is not None:
            bucket = self.graphs.bucket_for(batch, int(rows.numel()))
            if bucket is not None:
                return self.graphs.run(batch, bucket)
        return self.model.forward_with_logits(batch, self.cache, rows, prune=prune)

    def release(self, request_id: str) -> None:
        """Forget a finished or aborted request's generator and draft distribution."""
        self._generators.pop(request_id, None)
        self._draft_probs.pop(request_id, None)
        self.grammar.release(request_id)

    def _rows_to_sample(
        self, items: list[ScheduledSeq], first_rows: list[int]
    ) -> tuple[torch.Tensor, list[SampleRow]]:
        """The forward's rows whose logits the step reads [R] (each sampling item's last new
        token, then its drafts) and how each row is sampled."""
        rows: list[int] = []
        sample_rows: list[SampleRow] = []
        for item, first in zip(items, first_rows, strict=True):
            base = self._sample_row(item.seq)
            rows.extend(range(first, first + 1 + item.num_lookahead))
            sample_rows.extend(with_drafts(base, item.draft_token_ids))
        return torch.tensor(rows, dtype=torch.long, device=self.device), sample_rows

    def _sample(
        self, logits: torch.Tensor, items: list[ScheduledSeq], sample_rows: list[SampleRow]
    ) -> tuple[list[list[int]], list[list[TokenLogprobs] | None], SpecStepStats]:
        """Tokens and logprobs of each sampling item from its rows' logits [R, vocab] fp32: a
        plain sample, or its drafts verified."""
        plain = [i for i, item in enumerate(items) if not item.num_lookahead]
        starts = [0]
        for item in items:
            starts.append(starts[-1] + 1 + item.num_lookahead)
        raw_logits = self._mask(logits, items, starts)
        emitted: list[list[int]] = [[] for _ in items]
        if plain:
            at = torch.tensor([starts[i] for i in plain], dtype=torch.long, device=self.device)
            result = self.sampler.sample(logits[at], [sample_rows[starts[i]] for i in plain])
            for i, token in zip(plain, result.token_ids.tolist(), strict=True):
                emitted[i] = [token]
        checked = [i for i, item in enumerate(items) if item.num_lookahead]
        for greedy in (True, False):
            group = [i for i in checked if (items[i].seq.params.temperature == 0) == greedy]
            if not group:
                continue
            at_rows = [r for i in group for r in range(starts[i], starts[i + 1])]
            at = torch.tensor(at_rows, dtype=torch.long, device=self.device)
            rows_of = [sample_rows[r] for r in at_rows]
            target: torch.Tensor | list[int]
            if greedy:  # the target's own tokens: argmax after penalties
                target = apply_penalties(logits[at], rows_of).argmax(dim=-1).tolist()
            else:
                target = self.sampler.probs(logits[at], rows_of)
            offset = 0
            for i in group:
                count = 1 + items[i].num_lookahead
                emitted[i] = self._verify(items[i], target[offset : offset + count])
                offset += count
        num_verified = sum(items[i].num_lookahead for i in checked)
        num_accepted = sum(len(emitted[i]) - 1 for i in checked)
        logprobs: list[list[TokenLogprobs] | None] = [None] * len(items)
        wanted = [i for i, item in enumerate(items) if item.seq.params.logprobs]
        if wanted:
            at_rows = [starts[i] + j for i in wanted for j in range(len(emitted[i]))]
            chosen = torch.tensor(
                [t for i in wanted for t in emitted[i]], dtype=torch.long, device=self.device
            )
            at = torch.tensor(at_rows, dtype=torch.long, device=self.device)
            rows_of = [sample_rows[r] for r in at_rows]
            entries = self.sampler.logprobs(raw_logits[at], chosen, rows_of)
            position = 0
            for i in wanted:
                count = len(emitted[i])
                logprobs[i] = [e for e in entries[position : position + count] if e is not None]
                position += count
        stats = SpecStepStats(num_verified, num_accepted, len(checked))
        return emitted, logprobs, stats

    def _mask(
        self, logits: torch.Tensor, items: list[ScheduledSeq], starts: list[int]
    ) -> torch.Tensor:
        """Mask constrained rows of logits [R, V] in place to what their grammars allow; returns
        the logits as the model gave them (for logprobs: a copy when a masked row wants them)."""
        rows = [
            GrammarRow(
                item.seq.request_id,
                item.seq.grammar,
                item.seq.params.grammar_after,
                item.seq.output_token_ids,
                item.draft_token_ids,
                starts[i],
            )
            for i, item in enumerate(items)
            if item.seq.grammar is not None
        ]
        if not rows:
            return logits
        raw = logits
        if any(item.seq.params.logprobs and item.seq.grammar is not None for item in items):
            raw = logits.clone()
        self.grammar.apply(logits, rows)
        return raw

    def _verify(self, item: ScheduledSeq, target: torch.Tensor | list[int]) -> list[int]:
        """target: the target's tokens (greedy) or distributions [1 + k, V] at the last token
        and each draft."""
        drafts = item.draft_token_ids
        seq = item.seq
        if isinstance(target, list):
            return greedy_verify(target, drafts)
        q = self._draft_probs.get(seq.request_id)
        if q is None or q.shape[0] < len(drafts):
            raise RuntimeError(f"{seq.request_id}: no draft distribution for its drafts")
        generator = self._generators.get(seq.request_id)
        return rejection_sample(target, q[: len(drafts)], drafts, generator)

    def _draft(
        self,
        batch: ForwardBatch,
        hidden: torch.Tensor,
        scheduled: Sequence[ScheduledSeq],
        emitted: list[list[int]],
        depth: int,
    ) -> list[list[int]]:
        """Fill the MTP layer's latents at every position of the step; propose up to `depth`
        drafts per sequence that emitted tokens (fewer where its reserved slots end)."""
        assert self.drafter is not None
        next_ids: list[int] = []
        targets: list[DraftTarget] = []
        owners: list[int] = []
        row = 0
        for i, item in enumerate(scheduled):
            seq, tokens = item.seq, emitted[i]
            num_known = seq.num_tokens
            count = item.num_new_tokens + item.num_lookahead
            for position in range(item.start + 1, item.start + 1 + count):
                if position < num_known:
                    next_ids.append(seq.token_ids[position])
                elif position - num_known < len(tokens):
                    next_ids.append(tokens[position - num_known])
                else:
                    next_ids.append(0)  # after a rejected draft: rewritten when verified
            if tokens and not seq.params.is_seeded_sample:
                last = num_known + len(tokens) - 1  # position of the last emitted token
                capacity = len(seq.block_table) * self.block_size
                targets.append(
                    DraftTarget(
                        row=row + last - 1 - item.start,
                        position=last,
                        block_table=seq.block_table,
                        sample_row=self._sample_row(seq),
                        max_depth=min(depth, capacity - last + 1),
                    )
                )
                owners.append(i)
            row += count
        drafts = self.drafter.draft(batch, hidden, next_ids, targets)
        out: list[list[int]] = [[] for _ in scheduled]
        for j, i in enumerate(owners):
            out[i] = drafts.tokens[j]
            probs = drafts.probs[j]
            request_id = scheduled[i].seq.request_id
            if probs is None:
                self._draft_probs.pop(request_id, None)
            else:
                self._draft_probs[request_id] = probs
        return out

    def _sample_row(self, seq: Request) -> SampleRow:
        params = seq.params
        generator = self._generators.get(seq.request_id)
        if generator is None and params.seed is not None:
            generator = make_generator(params.seed, self.device)
            assert generator is not None
            self._generators[seq.request_id] = generator
        if not params.has_penalties:  # the history is only read by penalties
            return SampleRow(params, (), (), generator)
        return SampleRow(params, seq.prompt_token_ids, seq.output_token_ids, generator)
