"""Turns one scheduled step into one forward pass over the paged latent pool, then samples.

The runner owns every tensor of the engine: the latent pool (allocated once, sized by the
memory budget), each step's flattened batch, the logits and the per-request random generators.
The model's attention reads the batch and the pool only through ``ForwardBatch`` and
``PagedLatentCache``, so a GPU attention kernel plugs in behind the model without touching this
file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backend.engine.engine_config import EngineConfig, cache_bytes_per_block
from backend.engine.request import Request
from backend.engine.sampler import Sampler, SampleRow, TokenLogprobs, make_generator
from backend.engine.scheduler import ScheduledSeq, SchedulerOutput
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.model import DeepseekV3ForCausalLM

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunnerOutput:
    """Per scheduled sequence, in the scheduler's order: the sampled tokens (empty for a
    prefill chunk that does not reach the sequence's last token) and their logprobs, one per
    sampled token (None where the request did not ask for them or nothing was sampled)."""

    sampled_tokens: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None]


class ModelRunner:
    """Runs the model for the scheduler: one ``ForwardBatch`` and one forward per step.

    Decodes and prefill chunks share the step. Logits are computed only for rows that sample:
    the last new token of a sequence whose step reaches its last token. A seeded request draws
    from its own generator, kept from its first sample until `release`, so its samples do not
    depend on what else is batched with it (and survive preemption).
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
        self.cache = PagedLatentCache(
            num_layers=model.num_cache_layers,
            num_blocks=self.num_blocks,
            block_size=config.block_size,
            latent_dim=model.config.latent_dim,
            dtype=config.torch_dtype,
            device=self.device,
        )
        self.sampler = Sampler()
        self._generators: dict[str, torch.Generator] = {}
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

    @property
    def num_tokens_capacity(self) -> int:
        return self.num_blocks * self.block_size

    def execute(self, output: SchedulerOutput) -> RunnerOutput:
        """Run one step; the model writes the new tokens' latents into their slots."""
        scheduled = output.scheduled
        if not scheduled:
            return RunnerOutput([], [])
        if any(item.num_lookahead for item in scheduled):
            raise ValueError("this runner does not verify draft tokens (num_lookahead > 0)")
        batch = self.build_batch(scheduled)
        sample_rows: list[int] = []  # row of the last new token of each sampling sequence
        row = -1
        for item in scheduled:
            row += item.num_new_tokens
            if item.samples:
                sample_rows.append(row)
        sampled_tokens: list[list[int]] = [[] for _ in scheduled]
        logprobs: list[list[TokenLogprobs] | None] = [None] * len(scheduled)
        with torch.inference_mode():
            hidden = self.model(batch, self.cache)  # [T, D]
            if not sample_rows:
                return RunnerOutput(sampled_tokens, logprobs)
            index = torch.tensor(sample_rows, dtype=torch.long, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, index))  # [N, vocab] fp32
            samplers = [item for item in scheduled if item.samples]
            result = self.sampler.sample(logits, [self._sample_row(item.seq) for item in samplers])
        tokens = result.token_ids.tolist()
        position = 0
        for i, item in enumerate(scheduled):
            if item.samples:
                sampled_tokens[i] = [tokens[position]]
                entry = result.logprobs[position]
                logprobs[i] = None if entry is None else [entry]
                position += 1
        return RunnerOutput(sampled_tokens, logprobs)

    def release(self, request_id: str) -> None:
        """Forget a finished or aborted request's generator."""
        self._generators.pop(request_id, None)

    def build_batch(self, scheduled: Sequence[ScheduledSeq]) -> ForwardBatch:
        """The step's flat batch: ids, positions and slots of every new token, once per step."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens_q: list[int] = []
        context_lens: list[int] = []
        block_tables: list[list[int]] = []
        for item in scheduled:
            seq, start = item.seq, item.start
            end = start + item.num_new_tokens
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            _extend_slots(slots, seq.block_table, start, end, self.block_size)
            seq_lens_q.append(item.num_new_tokens)
            context_lens.append(end)
            # read during this step only; the scheduler changes tables between steps
            block_tables.append(seq.block_table)
        device = self.device
        return ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            seq_lens_q=seq_lens_q,
            context_lens=context_lens,
            block_tables=block_tables,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        )

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
