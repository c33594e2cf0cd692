"""Settings of difficulty routing (`[routing]`): rules, the scorer, breakers, stickiness and
overflow. Part of the one settings object (gateway/config/settings.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from gateway.config.frozen import FROZEN
from gateway.config.routing_rules import (
    GREETING_ONLY,
    PROOF_CHECK,
    PROOF_CHECK_UNLESS,
    PROOF_EDIT,
    PROOF_EDIT_UNLESS,
    PROOF_JOKE,
    PROOF_NOUN_WORDS,
    PROOF_REQUEST,
    PROOF_REQUEST_UNLESS,
    PROOF_WORDS,
)


class RuleSettings(BaseModel):
    """A named, versioned routing rule for auto models; the first that matches decides.
    Every condition given must hold. `thinking`: "on", "off", or "keep" (the mode the
    conversation already has; the rule falls through when it has none)."""

    model_config = FROZEN
    name: str = Field(
        min_length=1, max_length=40, pattern=r"^[a-z0-9-]+$", description="The rule's name."
    )
    version: int = Field(default=1, ge=1, description="Shown beside the name in the reason.")
    thinking: Literal["on", "off", "keep"] = Field(
        description='The mode it decides: "on", "off", or "keep" the conversation\'s.'
    )
    # conditions
    last_is_tool_result: bool | None = Field(
        default=None, description="Whether the last message must (not) be a tool result."
    )
    has_tools: bool | None = Field(
        default=None, description="Whether the request must (not) declare tools."
    )
    pattern: str | None = Field(
        default=None,
        description="A regex searched (case-insensitively) in the ask: the user's instruction "
        "without pasted material or the client's wrapper (gateway/routing/ask.py).",
    )
    unless: str | None = Field(
        default=None,
        description="A regex (case-insensitive) that undoes a match of `pattern`: a match whose "
        "sentence, or the sentence after it, holds it does not count (negation, a joke, "
        '"format this proof" beside "prove").',
    )
    quoted: bool = Field(
        default=False,
        description="Whether a match of `pattern` inside quotation marks counts (by default "
        "quoted words are what the ask is about, not what it asks).",
    )
    requires: tuple[str, ...] = Field(
        default=(),
        description="Words of which one must occur in the lower-cased ask before `pattern` is "
        "searched (a cheap test first); empty: the pattern is always searched.",
    )
    min_prompt_tokens: int | None = Field(
        default=None, ge=0, description="The least prompt tokens a request must have."
    )
    protocols: tuple[str, ...] = Field(
        default=(),
        description="chat, completions, responses, messages; empty: all.",
    )
    turns: tuple[Literal["new", "continue", "tool"], ...] = Field(
        default=(),
        description="The turn kinds it applies to (new, continue, tool: gateway/routing/ask.py); "
        "empty: all.",
    )

    @field_validator("pattern", "unless")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value


class ScorerSettings(BaseModel):
    """The learned scorer (gateway/routing/scorer.py): a logistic model over features of the
    ask; thinking goes on at `threshold` and above."""

    model_config = FROZEN
    weights_file: Path | None = Field(
        default=None,
        description="A model file written by `python -m gateway.routing.train` (gzipped JSON); "
        "empty: the model shipped with the gateway.",
    )
    threshold: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Thinking goes on at this score and above; empty: the model file's own "
        "threshold (chosen when it was trained).",
    )


class BreakerSettings(BaseModel):
    """Circuit breakers and rate-limit back-off per route key (provider, upstream model,
    account): gateway/routing/breaker.py says what counts as a failure."""

    model_config = FROZEN
    failures: int = Field(
        default=5, ge=1, description="Consecutive failures of a route key that open its breaker."
    )
    error_rate: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Share of failures over the last `window` outcomes that opens the breaker.",
    )
    window: int = Field(
        default=20, ge=1, description="Outcomes the error rate is taken over (once this many)."
    )
    cooldown_s: float = Field(
        default=0.5,
        gt=0,
        description="While a breaker is open: at most one probe request per this many seconds "
        "(one at a time); the probe's success closes it.",
    )
    panic: bool = Field(
        default=True,
        description="When every route of a model is open, try them anyway (as Envoy's panic "
        "threshold does) instead of refusing with 503 `providers_unavailable`.",
    )
    rate_limit_backoff_s: float = Field(
        default=1.0,
        ge=0,
        description="How long a route key is skipped after a 429 without Retry-After.",
    )
    max_backoff_s: float = Field(
        default=300.0,
        ge=0,
        description="The longest Retry-After of a 429 that is honoured (longer ones are cut).",
    )
    max_tracked: int = Field(
        default=4096,
        ge=1,
        description="Route keys with a breaker (and, apart, with a back-off) kept at most; "
        "closed breakers are forgotten first.",
    )


class PrefixSettings(BaseModel):
    """How long a queue a conversation whose prefix the local engine caches may wait in.

    Beyond `local_max_queue`, each request waiting over the allowance counts as recomputing
    `wait_cost_tokens` prompt tokens (an upstream recomputes the whole prompt, the local engine
    only what it does not cache): the local engine keeps the request while its cached tokens are
    at least `wait_cost_tokens` x (queue - local_max_queue), and the queue is at most
    `max_queue` (at or under `local_max_queue`: cached prompts overflow like cold ones)."""

    model_config = FROZEN
    wait_cost_tokens: int = Field(
        default=1024,
        ge=1,
        description="Prompt tokens of recomputation one request waiting beyond "
        "`local_max_queue` counts as (about one slot's turnover in upstream prefill).",
    )
    max_queue: int = Field(
        default=16,
        ge=0,
        description="The longest queue a cached conversation may still wait in for the local "
        "engine.",
    )


class RoutingSettings(BaseModel):
    model_config = FROZEN
    rules: tuple[RuleSettings, ...] = Field(
        default=(
            RuleSettings(
                name="greeting-only",
                version=2,
                thinking="off",
                pattern=GREETING_ONLY,
                turns=("new",),
            ),
            RuleSettings(
                name="proof-edit",
                thinking="off",
                pattern=PROOF_EDIT,
                unless=PROOF_EDIT_UNLESS,
                requires=PROOF_NOUN_WORDS,
            ),
            RuleSettings(
                name="proof-check",
                thinking="on",
                pattern=PROOF_CHECK,
                unless=PROOF_CHECK_UNLESS,
                requires=PROOF_NOUN_WORDS,
            ),
            RuleSettings(
                name="proof-request",
                version=2,
                thinking="on",
                pattern=PROOF_REQUEST,
                unless=PROOF_REQUEST_UNLESS,
                requires=PROOF_WORDS,
            ),
            RuleSettings(
                name="proof-joke", thinking="off", pattern=PROOF_JOKE, requires=PROOF_WORDS
            ),
        ),
        description="Named, versioned rules for auto models, in order: the first whose "
        "conditions all hold decides. Setting this list replaces the defaults.",
    )
    scorer: ScorerSettings = Field(
        default=ScorerSettings(),
        description="The learned model that decides when no rule does (its weights file and "
        "threshold).",
    )
    breaker: BreakerSettings = Field(
        default=BreakerSettings(),
        description="Circuit breakers and rate-limit back-off per (provider, model, account).",
    )
    sticky_ttl_s: int = Field(
        default=1800,
        ge=1,
        description="How long a conversation's mode is kept (in Redis, on every replica) for "
        'turns that continue its work: tool results, "continue" (gateway/routing/ask.py).',
    )
    local_max_queue: int = Field(
        default=4,
        ge=0,
        description="The local engine is preferred while the requests waiting for it (this one "
        "included) stay at or under this; beyond it an upstream route the key may use takes "
        "the request, unless the engine caches enough of the prompt (`prefix`).",
    )
    prefix: PrefixSettings = Field(
        default=PrefixSettings(),
        description="How long a queue a conversation whose prefix the local engine caches may "
        "still wait in.",
    )
