"""The auto decision without I/O: rules, then the conversation's mode, then the learned model.

The judge reads the ask of the request's last turn (`ask.ask_of`: the user's instruction apart
from the material it carries and the client's wrapper), then, first that applies:
  1. a rule (settings, in order) whose conditions all hold     reason rule:<name>@<version>
  2. a turn that continues the work (a tool result, "continue": see ask.py) in a conversation
     with a stored mode keeps it                                 reason sticky
  3. the learned model's score of the ask (for a continuing turn without a stored mode, of the
     ask it continues, rules first)                              reason model, with the score
A new question in a conversation is judged anew, whatever the conversation's mode.
Pure and synchronous, so its cost is measured on its own (benchmarks/routing.py). The router
seam (`decide.Decider`) reads the conversation's mode from Redis before calling it.
"""

from __future__ import annotations

import re

from gateway.config.routing import RoutingSettings
from gateway.routing.ask import Ask, ask_of
from gateway.routing.rules import compile_rules
from gateway.routing.scorer import Scorer
from plumbing.record import record
from providers.types import ChatRequest


@record
class Verdict:
    thinking: bool
    reason: str  # rule:<name>@<version> | sticky | model
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
        ask: Ask | None = None,
    ) -> Verdict:
        """`ask`: `ask_of(request)` where it was read already (off the event loop, with the
        prompt's tokenization)."""
        ask = ask_of(request) if ask is None else ask
        ruled = self._rule(request, protocol, prompt_tokens, ask, conversation_mode)
        if ruled is not None:
            return ruled
        if ask.turn != "new":
            if conversation_mode is not None:
                return Verdict(conversation_mode, "sticky")
            if ask.anchor is not None:
                ask = ask.anchor
                ruled = self._rule(request, protocol, prompt_tokens, ask, None)
                if ruled is not None:
                    return ruled
        score = self.scorer.score(ask)
        return Verdict(self.scorer.thinks(score), "model", score)

    def _rule(
        self,
        request: ChatRequest,
        protocol: str,
        prompt_tokens: int,
        ask: Ask,
        conversation_mode: bool | None,
    ) -> Verdict | None:
        lower = ask.instruction.lower()
        found: dict[re.Pattern[str], bool] = {}
        for rule in self.rules:
            if not rule.matches(request, protocol, prompt_tokens, ask, lower, found):
                continue
            if rule.thinking == "keep":
                if conversation_mode is None:
                    continue
                return Verdict(conversation_mode, rule.reason)
            return Verdict(rule.thinking == "on", rule.reason)
        return None
