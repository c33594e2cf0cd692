"""Named, versioned routing rules from settings; the first rule whose conditions all hold wins.

A rule's `thinking` is "on", "off", or "keep": the mode the conversation already has (from
stickiness); a "keep" rule falls through when the conversation has none. A decision by a rule is
explained as `rule:<name>@<version>`.
"""

from __future__ import annotations

import re
from typing import Literal

from gateway.config.routing import RuleSettings
from plumbing.record import record
from providers.types import ChatRequest


@record
class Rule:
    name: str
    version: int
    thinking: Literal["on", "off", "keep"]
    last_is_tool_result: bool | None
    has_tools: bool | None
    pattern: re.Pattern[str] | None
    min_prompt_tokens: int | None
    protocols: frozenset[str]

    @classmethod
    def of(cls, s: RuleSettings) -> Rule:
        pattern = re.compile(s.pattern, re.IGNORECASE) if s.pattern is not None else None
        return cls(
            s.name,
            s.version,
            s.thinking,
            s.last_is_tool_result,
            s.has_tools,
            pattern,
            s.min_prompt_tokens,
            frozenset(s.protocols),
        )

    @property
    def reason(self) -> str:
        return f"rule:{self.name}@{self.version}"

    def matches(self, request: ChatRequest, protocol: str, prompt_tokens: int, text: str) -> bool:
        """`text`: what the pattern is searched in, the scanned head of the last user turn
        (`signals.scanned_text`)."""
        if self.protocols and protocol not in self.protocols:
            return False
        if self.has_tools is not None and bool(request.tools) != self.has_tools:
            return False
        if self.last_is_tool_result is not None:
            last = request.messages[-1].role if request.messages else None
            if (last == "tool") != self.last_is_tool_result:
                return False
        if self.min_prompt_tokens is not None and prompt_tokens < self.min_prompt_tokens:
            return False
        return self.pattern is None or self.pattern.search(text) is not None


def compile_rules(settings: tuple[RuleSettings, ...]) -> tuple[Rule, ...]:
    return tuple(Rule.of(s) for s in settings)
