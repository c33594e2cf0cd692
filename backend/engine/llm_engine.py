"""The synchronous engine: requests in, one scheduled and executed step per `step()` call.

Not thread-safe: one thread owns it (``backend.engine.async_engine.AsyncEngine`` runs it in its own
thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backend.engine.blocks import BlockEvent, BlockManager, BlockPool
from backend.engine.engine_config import EngineConfig, max_model_len, num_cache_blocks
from backend.engine.interface import EngineStats, PromptTooLong, RequestOutput, TokenLogprobs
from backend.engine.ranked_blocks import RankedBlockManager
from backend.engine.request import FinishReason, Request
from backend.engine.runner import ModelRunner, SpecStepStats
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import Scheduler, SchedulerOutput
from backend.engine.spec_policy import SpecPolicy
from backend.model.checkpoint import GenerationDefaults
from backend.model.model import DeepseekV3ForCausalLM


@dataclass(slots=True)
class _SpecTotals:
    draft_steps: int = 0
    proposed: int = 0
    verified: int = 0
    accepted: int = 0
    verifications: int = 0
    draft_seconds: float = 0.0

    def add(self, step: SpecStepStats, *, drafted: bool) -> None:
        self.draft_steps += drafted
        self.proposed += step.num_proposed
        self.verified += step.num_verified
        self.accepted += step.num_accepted
        self.verifications += step.num_verifications
        self.draft_seconds += step.draft_seconds


@dataclass(slots=True)
class _Tracked:
    seq: Request
    num_cached_tokens: int | None = None  # set when first scheduled


class LLMEngine:
    """Scheduler + block manager + model runner, driven one `step()` at a time.

    `hash_seed` (the checkpoint's fingerprint) seeds the prefix-cache block hashes;
    `generation_defaults` fill a request's unset temperature / top_p and add stop tokens;
    `on_block_event` hears every prefix-cache registration and eviction (called from whichever
    thread runs `step`).
    """

    def __init__(
        self,
        model: DeepseekV3ForCausalLM,
        config: EngineConfig,
        *,
        hash_seed: bytes,
        generation_defaults: GenerationDefaults | None = None,
        on_block_event: Callable[[BlockEvent], None] | None = None,
    ) -> None:
        defaults = generation_defaults or GenerationDefaults()
        self.config = config
        self.hash_seed = hash_seed
        self.vocab_size = model.config.vocab_size
        num_blocks = num_cache_blocks(config, model.config, mtp=model.num_mtp_layers > 0)
        self.runner = ModelRunner(model, config, num_blocks)
        self.block_manager: BlockPool
        self.attention_ranks = model.attention_ranks
        if model.attention_ranks > 1:  # a pool of num_blocks per attention rank
            self.block_manager = RankedBlockManager(
                model.attention_ranks, num_blocks, model.attention_pool_stride,
                config.block_size, hash_seed, on_block_event,
            )  # fmt: skip
        else:
            self.block_manager = BlockManager(
                num_blocks, config.block_size, hash_seed, on_block_event
            )
        self.num_spec_tokens = (
            config.spec_num_tokens if config.spec_enabled and self.runner.can_draft else 0
        )
        self.max_model_len = max_model_len(
            config, model.config, num_blocks, Scheduler.num_lookahead_slots(self.num_spec_tokens)
        )
        self.spec_policy = (
            SpecPolicy() if self.num_spec_tokens and config.spec_policy == "measured" else None
        )
        eos_ids = set(defaults.eos_token_ids)
        if model.config.eos_token_id is not None:
            eos_ids.add(model.config.eos_token_id)
        self.scheduler = Scheduler(
            config.max_num_seqs,
            config.max_batch_tokens,
            self.block_manager,
            config.chunked_prefill,
            max_model_len=self.max_model_len,
            eos_token_ids=eos_ids,
            num_lookahead=self.num_spec_tokens,
            spec_max_batch_size=config.spec_max_batch_size,
            draft_policy=self.spec_policy.should_draft if self.spec_policy else None,
        )
        self.graph_report = self.runner.setup_decode_graphs(
            config,
            self.max_model_len + Scheduler.num_lookahead_slots(self.num_spec_tokens),
            self.num_spec_tokens,
        )
        self._sampling_defaults = {"temperature": defaults.temperature, "top_p": defaults.top_p}
        self._requests: dict[str, _Tracked] = {}
        self._prefix_hit_tokens = 0
        self._prefix_query_tokens = 0
        self._num_steps = 0
        self._num_preemptions = 0
        self._batched_tokens = 0
        self._batched_seqs = 0
        self._generated_tokens = 0
        self._last_batch_tokens = 0
        self._last_batch_seqs = 0
        self._last_step_seconds = 0.0
        self._spec = _SpecTotals()

    @property
    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Raise ValueError (PromptTooLong for length) unless `add_request` would accept it.

        Reads only fixed facts, so any thread may call it.
        """
        if not prompt_ids:
            raise ValueError("the prompt has no tokens")
        if len(prompt_ids) >= self.max_model_len:
            raise PromptTooLong(
                f"the prompt has {len(prompt_ids)} tokens; this engine serves at most "
                f"{self.max_model_len} tokens of prompt and output together"
            )
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")

    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        grammar: object | None = None,
    ) -> None:
        """Queue a request; unset temperature / top_p take the checkpoint's defaults. `grammar`:
        `params.grammar` compiled (`GrammarCompiler`), required when that is set."""
        self.check_prompt(prompt_ids)
        if request_id in self._requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        if (params.grammar is None) != (grammar is None):
            raise ValueError("a grammar constraint needs its compiled grammar, and only then")
        defaults = params.with_defaults(self._sampling_defaults)
        seq = Request(request_id, list(prompt_ids), defaults, grammar)
        self.scheduler.add(seq)
        self._requests[request_id] = _Tracked(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish a live request with "abort", freeing its blocks; None if it is not live."""
        return self.finish(request_id, "abort")

    def finish(self, request_id: str, reason: FinishReason) -> RequestOutput | None:
        """Finish a live request now (e.g. its caller matched a stop string); its final output
        carries no new tokens. None if the request is not live."""
        seq = self.scheduler.finish(request_id, reason)
        if seq is None:
            return None
        return self._output(self._release(request_id), [], None)

    def abort_all(self) -> list[RequestOutput]:
        outputs = [self.abort(request_id) for request_id in list(self._requests)]
        return [output for output in outputs if output is not None]

    def step(self) -> list[RequestOutput]:
        """Schedule, run and apply one step; one output per request that got tokens or
        finished in it. Raises RuntimeError when live requests exist but nothing can run."""
        started = time.perf_counter()
        scheduled = self.scheduler.schedule()
        self._num_preemptions += len(scheduled.preempted)
        if scheduled.is_empty:
            if self._requests and not scheduled.preempted:
                raise RuntimeError("the scheduler found nothing to run for live requests")
            return []
        self._note_first_schedule(scheduled)
        result = self.runner.execute(scheduled)
        lengths = [item.seq.num_tokens for item in scheduled.scheduled]
        self.scheduler.postprocess(scheduled, result.sampled_tokens, result.draft_tokens)
        self._spec.add(result.spec, drafted=scheduled.num_spec_tokens > 0)
        outputs = self._collect(scheduled, lengths, result.logprobs)
        self._num_steps += 1
        self._last_batch_tokens = scheduled.num_batched_tokens
        self._last_batch_seqs = len(scheduled.scheduled)
        self._batched_tokens += self._last_batch_tokens
        self._batched_seqs += self._last_batch_seqs
        self._last_step_seconds = time.perf_counter() - started
        if self.spec_policy is not None and _is_decode_step(scheduled):
            drafted = scheduled.num_spec_tokens > 0
            if not drafted or result.spec.num_verifications:  # steady drafting steps only
                tokens = sum(len(tokens) for tokens in result.sampled_tokens)
                self.spec_policy.observe(
                    len(scheduled.scheduled), drafted, tokens, self._last_step_seconds
                )
        return outputs

    def close(self) -> None:
        """Release the model's resources beyond this process (the parallel engine's ranks)."""
        self.runner.model.close()

    def stats(self) -> EngineStats:
        return EngineStats(
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running),
            num_free_blocks=self.block_manager.num_free_blocks,
            num_total_blocks=self.block_manager.num_blocks,
            prefix_cache_hit_tokens_total=self._prefix_hit_tokens,
            prefix_cache_query_tokens_total=self._prefix_query_tokens,
            num_steps_total=self._num_steps,
            num_preemptions_total=self._num_preemptions,
            num_batched_tokens_total=self._batched_tokens,
            num_batched_seqs_total=self._batched_seqs,
            num_generated_tokens_total=self._generated_tokens,
            last_batch_tokens=self._last_batch_tokens,
            last_batch_seqs=self._last_batch_seqs,
            last_step_seconds=self._last_step_seconds,
            spec_num_tokens=self.num_spec_tokens,
            spec_draft_steps_total=self._spec.draft_steps,
            spec_proposed_tokens_total=self._spec.proposed,
            spec_verified_tokens_total=self._spec.verified,
            spec_accepted_tokens_total=self._spec.accepted,
            spec_verifications_total=self._spec.verifications,
            spec_draft_seconds_total=self._spec.draft_seconds,
            num_attention_ranks=self.attention_ranks,
        )

    def _note_first_schedule(self, scheduled: SchedulerOutput) -> None:
        """Record prefix-cache hits at a request's first allocation (not at recomputes)."""
        for item in scheduled.scheduled:
            request = self._requests[item.seq.request_id]
            if request.num_cached_tokens is None:
                request.num_cached_tokens = item.seq.num_cached_tokens
                self._prefix_hit_tokens += item.seq.num_cached_tokens
                self._prefix_query_tokens += item.seq.num_prompt_tokens

    def _collect(
        self,
        scheduled: SchedulerOutput,
        lengths: list[int],
        logprobs: list[list[TokenLogprobs] | None],
    ) -> list[RequestOutput]:
        """Outputs of the step just applied; `lengths`: each sequence's tokens before it;
        `logprobs`: per sequence, one entry per token the runner sampled."""
        outputs: list[RequestOutput] = []
        for item, length, sampled in zip(scheduled.scheduled, lengths, logprobs, strict=True):
            seq = item.seq
            new_tokens = seq.token_ids[length:]
            if not new_tokens and not seq.is_finished:
                continue
            self._generated_tokens += len(new_tokens)
            if seq.is_finished:
                request = self._release(seq.request_id)
            else:
                request = self._requests[seq.request_id]
            # the new tokens are the sampled ones up to a stop token, so their entries lead
            token_logprobs = sampled[: len(new_tokens)] if sampled and new_tokens else None
            outputs.append(self._output(request, new_tokens, token_logprobs))
        return outputs

    def _release(self, request_id: str) -> _Tracked:
        self.runner.release(request_id)
        return self._requests.pop(request_id)

    @staticmethod
    def _output(
        request: _Tracked, new_tokens: list[int], logprobs: list[TokenLogprobs] | None
    ) -> RequestOutput:
        seq = request.seq
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new_tokens,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens or 0,
            logprobs=logprobs,
        )


def _is_decode_step(scheduled: SchedulerOutput) -> bool:
    """Every sequence of the step decodes (one new token, its drafts aside)."""
    return all(item.num_new_tokens == 1 and item.samples for item in scheduled.scheduled)
