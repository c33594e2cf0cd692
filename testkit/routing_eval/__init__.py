"""The routing evaluation data: labelled conversations, and how a judge is scored on them
(used by gateway/routing/train.py's users: tests/gateway/routing/test_routing_eval.py and
benchmarks/routing.py).

`train.jsonl` and `train_extra.jsonl` (split "train", by different authors: the learned scorer
is fitted on both), `train_extra2.jsonl` (split "train", a third author's: hard asks in the shapes
of small ones and small asks in the shapes of hard ones; the shipped model is not fitted on it,
`python -m gateway.routing.train --train` names it) and `eval.jsonl` (split
"tune": the threshold may be chosen on it; "heldout": agreement is reported on it, never used
for fitting or choosing), written from the rubric by people other than the scorer's author.
One object a line: id, lang (en, zh, ja, ko, de, fr, es, pt, ru or mixed), label (think | fast,
for the LAST turn), category, adversarial, client (plain | cline | claude-code | codex | sdk),
messages (the chat messages as the client sends them), note, split.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.pipeline.prompt_estimates import estimate_prompt_tokens
from gateway.routing.judge import Judge, Verdict
from gateway.routing.train import request_of
from providers.types import ChatRequest

HERE = Path(__file__).parent
TRAIN = HERE / "train.jsonl"
TRAIN_EXTRA = HERE / "train_extra.jsonl"
TRAIN_EXTRA2 = HERE / "train_extra2.jsonl"
EVAL = HERE / "eval.jsonl"


@dataclass(frozen=True, slots=True)
class Item:
    id: str
    lang: str
    label: str
    category: str
    adversarial: bool
    client: str
    messages: list[dict[str, Any]]
    note: str
    split: str

    @property
    def think(self) -> bool:
        return self.label == "think"

    def request(self) -> ChatRequest:
        return request_of(self.messages)

    def text(self) -> str:
        """The last message's text (for listing misses)."""
        content = self.messages[-1].get("content") or ""
        return content if isinstance(content, str) else json.dumps(content)


def load(path: Path = EVAL) -> list[Item]:
    with path.open(encoding="utf-8") as fh:
        return [Item(**json.loads(line)) for line in fh if line.strip()]


def verdicts(judge: Judge, items: list[Item]) -> list[Verdict]:
    """The judge's decision for each item's last turn, the conversation having no stored mode
    (a continuing turn is then decided on the ask it continues, as its first turn was)."""
    out = []
    for item in items:
        request = item.request()
        out.append(judge.judge(request, "chat", estimate_prompt_tokens(request)))
    return out


def decisions(verdicts_: list[Verdict], threshold: float) -> list[bool]:
    """Thinking per item at `threshold` (rule decisions stand; scored ones are re-cut)."""
    return [v.thinking if v.score is None else v.score >= threshold for v in verdicts_]


@dataclass(frozen=True, slots=True)
class Report:
    """Agreement of decisions with labels, and both kinds of error."""

    n: int
    agreement: float
    fast_on: float  # of the fast items, the share sent to thinking
    think_off: float  # of the think items, the share sent to fast

    @classmethod
    def of(cls, items: list[Item], thinking: list[bool]) -> Report:
        pairs = list(zip(items, thinking, strict=True))
        fast = [t for i, t in pairs if not i.think]
        think = [t for i, t in pairs if i.think]
        agree = sum(i.think == t for i, t in pairs)
        return cls(
            len(pairs),
            agree / len(pairs) if pairs else 0.0,
            sum(fast) / len(fast) if fast else 0.0,
            sum(not t for t in think) / len(think) if think else 0.0,
        )


def agreement(items: list[Item], thinking: list[bool]) -> float:
    return Report.of(items, thinking).agreement


def by(items: list[Item], thinking: list[bool], key: str) -> dict[str, Report]:
    """A report per value of the item field `key` (category, lang, client, adversarial)."""
    groups: dict[str, tuple[list[Item], list[bool]]] = {}
    for item, t in zip(items, thinking, strict=True):
        part = groups.setdefault(str(getattr(item, key)), ([], []))
        part[0].append(item)
        part[1].append(t)
    return {k: Report.of(*v) for k, v in sorted(groups.items())}


def reasons_of_misses(
    items: list[Item], verdicts_: list[Verdict], thinking: list[bool]
) -> Counter[str]:
    """How many misses each reason (a rule's name, sticky, model) decided."""
    return Counter(
        v.reason for i, v, t in zip(items, verdicts_, thinking, strict=True) if i.think != t
    )
