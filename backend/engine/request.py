"""One request's token state as the scheduler and block manager see it. Pure Python, no torch."""

from __future__ import annotations

from enum import Enum, auto
from typing import Literal

from backend.engine.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "abort"]


class RequestStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Request:
    """Prompt and output tokens plus how far the KV cache has computed them.

    `token_ids` is the prompt followed by the output. Tokens [0, num_computed_tokens) have their
    KV in the blocks of `block_table` (block i holds positions [i * block_size, (i+1) *
    block_size)); the rest are computed by later steps. `block_hashes` caches the hash chain of
    the full blocks of `token_ids` (tokens never change, so neither do the hashes).
    `num_cached_tokens`: how many tokens the latest allocation took from the prefix cache.
    `arrival` orders requests: lower came first (the scheduler assigns it in `add`).
    `num_reasoning_tokens` counts output tokens while reasoning is open (only tracked when the
    params set a reasoning budget); `in_reasoning` turns False at the end-of-thinking token.
    `draft_token_ids`: tokens the MTP layer proposed to follow `token_ids`, not yet verified
    (never part of `token_ids`, never counted as computed).
    `grammar`: the compiled grammar of `params.grammar` (opaque here; the runner's masks read it).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        grammar: object | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("a prompt needs at least one token")
        self.request_id = request_id
        self.params = params
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.arrival = 0
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []
        self.in_reasoning = params.max_reasoning_tokens is not None
        self.num_reasoning_tokens = 0
        self.draft_token_ids: list[int] = []
        self.grammar = grammar

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
