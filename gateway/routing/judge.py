"""The auto decision without I/O: rules first, then the conversation's mode, then the scorer.

Pure and synchronous, so its cost is measured on its own (benchmarks/routing.py). The router
seam (`decide.Decider`) reads the conversation's mode from Redis before calling it.
"""

from __future__ import annotations

from gateway.config.routing import RoutingSettings
from gateway.routing.rules import compile_rules
from gateway.routing.scorer import Scorer
from gateway.routing.signals import scanned_text, signals_of, user_turns
from plumbing.record import record
from providers.types import ChatRequest


@record
class Verdict:
    thinking: bool
    reason: str  # rule:<name>@<version> | sticky | score
    score: float | None = None


class Judge:
    def __init__(self, settings: RoutingSettings) -> None:
        self.rules = compile_rules(settings.rules)
        self.scorer = Scorer(settings.scorer)

    def judge(
        self,
        request: ChatRequest,
        protocol: str,
        prompt_tokens: int,
        conversation_mode: bool | None = None,
    ) -> Verdict:
        text = scanned_text(request, self.scorer.scan_chars)
        for rule in self.rules:
            if not rule.matches(request, protocol, prompt_tokens, text):
                continue
            if rule.thinking == "keep":
                if conversation_mode is None:
                    continue
                return Verdict(conversation_mode, rule.reason)
            return Verdict(rule.thinking == "on", rule.reason)
        if conversation_mode is not None:
            return Verdict(conversation_mode, "sticky")
        score = self.scorer.score(signals_of(text, user_turns(request)))
        return Verdict(self.scorer.thinks(score), "score", score)
