"""What callers of the engine see: its outputs, its stats snapshot and its errors.

Torch-free, so that a process that only talks to an engine elsewhere (a serving worker without
the model, reaching worker 0's engine over a socket; a cluster peer's client) imports no torch.
The engine modules (`llm_engine`, `sampler`, `async_engine`) use and re-export these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from backend.engine.request import FinishReason


class PromptTooLong(ValueError):
    """The prompt leaves no room for one output token within the engine's length limit."""


class EngineOverloaded(Exception):
    """`max_waiting` requests already wait; try again after `retry_after_s` seconds."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"engine queue is full; retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class EngineClosed(RuntimeError):
    """The engine is not started, is stopping, or has stopped."""


class EngineError(RuntimeError):
    """The engine failed while serving the request (the cause is chained)."""


class EngineDown(RuntimeError):
    """The engine can run no more steps (a rank of the parallel engine died or hung): the
    engine stops, its requests fail, and a restart brings it back. ``ranks`` names the ranks
    at fault and what happened to each ("exited with code -9", "stopped responding")."""

    def __init__(self, message: str, ranks: Mapping[int, str] | None = None) -> None:
        super().__init__(message)
        self.ranks: dict[int, str] = dict(ranks or {})


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Raw model logprob of the chosen token and the `top_logprobs` best (id, logprob)."""

    logprob: float
    top: list[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one step produced for one request.

    `new_token_ids` are the tokens appended this step (stop tokens included); `finish_reason`
    is set exactly when `finished`. `num_cached_tokens` counts the prompt tokens taken from
    the prefix cache when the request was first scheduled (0 before that). `logprobs` has one
    entry per new token, in order, when the request asked for logprobs and the step produced
    tokens, else None.
    """

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list[TokenLogprobs] | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot for metrics; `*_total` counters only grow."""

    num_waiting: int
    num_running: int
    num_free_blocks: int
    num_total_blocks: int
    prefix_cache_hit_tokens_total: int  # prompt tokens served from the prefix cache
    prefix_cache_query_tokens_total: int  # prompt tokens looked up in it
    num_steps_total: int
    num_preemptions_total: int
    num_batched_tokens_total: int  # new tokens over all steps
    num_batched_seqs_total: int  # sequences over all steps
    num_generated_tokens_total: int
    last_batch_tokens: int
    last_batch_seqs: int
    last_step_seconds: float
    # speculative decoding (MTP): drafts per step (0: off), steps that drafted, drafts proposed,
    # drafts verified and accepted, sequence-steps that verified drafts, seconds drafting
    spec_num_tokens: int = 0
    spec_draft_steps_total: int = 0
    spec_proposed_tokens_total: int = 0
    spec_verified_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0
    spec_verifications_total: int = 0
    spec_draft_seconds_total: float = 0.0
    # prefix-cache pools: one per data-parallel attention rank, else 1
    num_attention_ranks: int = 1

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted / verified drafts (0 before any)."""
        verified = self.spec_verified_tokens_total
        return self.spec_accepted_tokens_total / verified if verified else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens emitted per verification: accepted drafts plus the target's own (0 before any)."""
        count = self.spec_verifications_total
        return 1 + self.spec_accepted_tokens_total / count if count else 0.0
