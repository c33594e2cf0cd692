"""The routing evaluation set: prompts labelled think or direct, and how a judge is scored on
it (used by tests/gateway/routing/test_routing_eval.py and benchmarks/routing.py).

`prompts.jsonl`, one object per line: id, lang (en | zh), label (think | direct), category,
split (tune: thresholds and weights are chosen on it | heldout: agreement is reported on it),
source (where the prompt and its label come from), text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gateway.pipeline.prompt_estimates import estimate_prompt_tokens
from gateway.routing.judge import Judge, Verdict
from providers.types import ChatRequest, Message

PROMPTS = Path(__file__).with_name("prompts.jsonl")


@dataclass(frozen=True, slots=True)
class Item:
    id: str
    lang: str
    label: str
    category: str
    split: str
    source: str
    text: str

    @property
    def think(self) -> bool:
        return self.label == "think"

    def request(self) -> ChatRequest:
        return ChatRequest(model="auto", messages=(Message(role="user", content=self.text),))


def load() -> list[Item]:
    with PROMPTS.open(encoding="utf-8") as fh:
        return [Item(**json.loads(line)) for line in fh if line.strip()]


def verdicts(judge: Judge, items: list[Item]) -> list[Verdict]:
    """The judge's decision for each item as the first turn of a chat conversation."""
    out = []
    for item in items:
        request = item.request()
        out.append(judge.judge(request, "chat", estimate_prompt_tokens(request)))
    return out


def decisions(verdicts_: list[Verdict], threshold: float) -> list[bool]:
    """Thinking per item at `threshold` (rule decisions stand; scored ones are re-cut)."""
    return [v.thinking if v.score is None else v.score >= threshold for v in verdicts_]


def agreement(items: list[Item], thinking: list[bool]) -> float:
    return sum(i.think == t for i, t in zip(items, thinking, strict=True)) / len(items)


def best_threshold(items: list[Item], verdicts_: list[Verdict]) -> float:
    """The threshold with the highest agreement on `items` (ties: the one nearest 0.5)."""
    candidates = sorted({round(v.score, 4) for v in verdicts_ if v.score is not None} | {0.5})
    return max(
        candidates,
        key=lambda t: (agreement(items, decisions(verdicts_, t)), -abs(t - 0.5)),
    )
