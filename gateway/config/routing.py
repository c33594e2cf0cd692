"""Settings of difficulty routing (`[routing]`): rules, the scorer, breakers, stickiness and
overflow. Part of the one settings object (gateway/config/settings.py)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class RuleSettings(BaseModel):
    """A named, versioned routing rule for auto models; the first that matches decides.
    Every condition given must hold. `thinking`: "on", "off", or "keep" (the mode the
    conversation already has; the rule falls through when it has none)."""

    model_config = _FROZEN
    name: str = Field(
        min_length=1,
        max_length=40,
        pattern=r"^[a-z0-9-]+$",
        description="The rule's name (lower-case letters, digits, dashes), reported as "
        "`rule:<name>@<version>`.",
    )
    version: int = Field(default=1, ge=1, description="The rule's version, reported with its name.")
    thinking: Literal["on", "off", "keep"] = Field(
        description="What the rule decides: `on`, `off`, or `keep` (the conversation's mode; "
        "the rule falls through when it has none)."
    )
    last_is_tool_result: bool | None = Field(
        default=None, description="Condition: the last message is (true) or is not a tool result."
    )
    has_tools: bool | None = Field(
        default=None, description="Condition: the request offers tools (true) or none (false)."
    )
    pattern: str | None = Field(
        default=None,
        description="Condition: a regular expression found in the last user turn "
        "(case-insensitive).",
    )
    min_prompt_tokens: int | None = Field(
        default=None, ge=0, description="Condition: the prompt has at least this many tokens."
    )
    protocols: tuple[str, ...] = Field(
        default=(),
        description="Condition: the request came in on one of these APIs (`chat`, "
        "`completions`, `responses`, `messages`); empty: any.",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value


class ScorerSettings(BaseModel):
    """Weights of the cheap-signal scorer: score = sigmoid(bias + sum(weight * signal)); thinking
    goes on at `threshold` and above. Signals are described in gateway/routing/signals.py."""

    model_config = _FROZEN
    threshold: float = Field(
        default=0.28,
        ge=0,
        le=1,
        description="Thinking goes on at this score and above (chosen on the tuning half of the "
        "routing evaluation set, `benchmarks/routing.py`).",
    )
    bias: float = Field(default=-1.67, description="The scorer's intercept.")
    weights: dict[str, float] = Field(
        default_factory=lambda: {
            "maths": 2.2,
            "proof": 1.83,
            "algorithm": 1.26,
            "debugging": 0.63,
            "design": 2.08,
            "code_block": 0.49,
            "stack_trace": 0.68,
            "reasoning_ask": 2.59,
            "constraints": 0.43,
            "length": 2.69,
            "depth": 0.0,
            "easy": -1.39,
            "cjk": -0.44,
        },
        description="Weight per signal (fitted by `benchmarks/routing.py --fit`); a signal "
        "left out weighs 0, an unknown name is refused at start.",
    )
    scan_chars: int = Field(
        default=2000,
        gt=0,
        description="Only this many leading characters of the last user turn are read "
        "(bounded cost).",
    )


class BreakerSettings(BaseModel):
    """Circuit breakers and rate-limit back-off per route key (provider, upstream model,
    account): gateway/routing/breaker.py says what counts as a failure."""

    model_config = _FROZEN
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

    model_config = _FROZEN
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
    model_config = _FROZEN
    rules: tuple[RuleSettings, ...] = Field(
        default=(
            RuleSettings(name="tool-results", thinking="keep", last_is_tool_result=True),
            RuleSettings(name="tools", thinking="off", has_tools=True),
            RuleSettings(
                name="proof-markers",
                thinking="on",
                pattern=r"\b(prove|proof|show that|lemma|theorem)\b|证明|求证",
            ),
        ),
        description="Named, versioned rules for auto models, in order: the first whose "
        "conditions all hold decides. Setting this list replaces the defaults.",
    )
    scorer: ScorerSettings = Field(
        default=ScorerSettings(),
        description="The cheap-signal scorer that decides when no rule does: "
        "sigmoid(bias + sum(weight x signal)).",
    )
    breaker: BreakerSettings = Field(
        default=BreakerSettings(),
        description="Per-provider circuit breaker: an open one is skipped at once.",
    )
    sticky_ttl_s: int = Field(
        default=1800,
        ge=1,
        description="An auto conversation keeps the thinking mode it began with for this many "
        "seconds (stored in Redis, on every replica).",
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
