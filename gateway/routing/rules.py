"""Named, versioned routing rules from settings; the first rule whose conditions all hold wins.

A rule's `thinking` is "on", "off", or "keep": the mode the conversation already has (from
stickiness); a "keep" rule falls through when the conversation has none. A decision by a rule is
explained as `rule:<name>@<version>`.
A rule's `pattern` is searched in the ask's instruction (`ask.Ask.instruction`: the user's own
words, without pasted material or the client's wrapper), case-insensitively; `turns` limits it to
new, continue or tool turns; `requires` names words of which one must occur in the ask before the
pattern is searched (a substring test costs far less than a search). Word boundaries and context
belong in the pattern: the defaults (gateway/config/routing.py) match a request to prove at the
start of a sentence, not "the logs show that" or "who proved".
"""

from __future__ import annotations

import re
from typing import Literal

from gateway.config.routing import RuleSettings
from gateway.routing.ask import Ask
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
    requires: tuple[str, ...]
    min_prompt_tokens: int | None
    protocols: frozenset[str]
    turns: frozenset[str]

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
            tuple(word.lower() for word in s.requires),
            s.min_prompt_tokens,
            frozenset(s.protocols),
            frozenset(s.turns),
        )

    @property
    def reason(self) -> str:
        return f"rule:{self.name}@{self.version}"

    def matches(self, request: ChatRequest, protocol: str, prompt_tokens: int, ask: Ask) -> bool:
        if self.protocols and protocol not in self.protocols:
            return False
        if self.turns and ask.turn not in self.turns:
            return False
        if self.has_tools is not None and bool(request.tools) != self.has_tools:
            return False
        if self.last_is_tool_result is not None:
            last = request.messages[-1].role if request.messages else None
            if (last == "tool") != self.last_is_tool_result:
                return False
        if self.min_prompt_tokens is not None and prompt_tokens < self.min_prompt_tokens:
            return False
        if self.requires:
            lower = ask.instruction.lower()
            if not any(word in lower for word in self.requires):
                return False
        return self.pattern is None or self.pattern.search(ask.instruction) is not None


def compile_rules(settings: tuple[RuleSettings, ...]) -> tuple[Rule, ...]:
    return tuple(Rule.of(s) for s in settings)
