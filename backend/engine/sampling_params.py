"""Per-request sampling settings, validated when built. Pure Python, no torch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

MAX_TOP_LOGPROBS = 20
_MAX_SEED = 2**64


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What one request asks of the sampler and of the scheduler's stop rules.

    `temperature` / `top_p` left as None take the checkpoint's generation_config.json values
    through `with_defaults` (the sampler refuses None). temperature 0 means greedy. `top_k` 0 and
    `min_p` 0 are off. Penalties: `repetition_penalty` (HF: over prompt and output, divides a
    positive logit, multiplies a negative one), `presence_penalty` and `frequency_penalty`
    (OpenAI: over output only, subtracted from the logit). `max_tokens` None runs to the model's
    length limit. `stop` strings are matched by the caller on detokenized text.
    `max_reasoning_tokens` with `reasoning_end_token_id`: the output starts as reasoning (the
    prompt opened it) and holds at most that many reasoning tokens, the end-of-thinking token
    included: when the budget is one short, the engine appends `reasoning_end_token_id` itself
    instead of sampling, and the answer follows.
    `grammar`: the output's constraint (`backend.text.structured.Constraint.text`), enforced by
    masking the logits; it applies once `grammar_after`'s tokens have appeared in the output, in
    order (the end of thinking, say), so what comes before them is free.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    max_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    max_reasoning_tokens: int | None = None
    reasoning_end_token_id: int | None = None
    grammar: str | None = None
    grammar_after: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature is not None and not (
            math.isfinite(self.temperature) and self.temperature >= 0
        ):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not 0 <= self.seed < _MAX_SEED:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.max_reasoning_tokens is not None and self.max_reasoning_tokens < 1:
            raise ValueError(f"max_reasoning_tokens must be >= 1, got {self.max_reasoning_tokens}")
        if (self.max_reasoning_tokens is None) != (self.reasoning_end_token_id is None):
            raise ValueError("max_reasoning_tokens and reasoning_end_token_id go together")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]")
        if any(t < 0 for t in self.grammar_after):
            raise ValueError("grammar_after must hold token ids")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs")

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    @property
    def is_seeded_sample(self) -> bool:
        """A sampled request with its own seed: its tokens must not depend on the batch, so it
        never verifies drafts (which drafts it would get depends on the load)."""
        return self.seed is not None and self.temperature != 0

    def with_defaults(self, generation_config: Mapping[str, Any]) -> SamplingParams:
        """Fill temperature / top_p the request left unset from generation_config.json
        (DeepSeek-V3.1 ships 0.6 / 0.95), else from the OpenAI defaults 1.0 / 1.0."""
        temperature = self.temperature
        if temperature is None:
            temperature = float(generation_config.get("temperature", 1.0))
        top_p = self.top_p
        if top_p is None:
            top_p = float(generation_config.get("top_p", 1.0))
        return replace(self, temperature=temperature, top_p=top_p)
