"""The routing data sets are what the rubric asks for, the shipped model was trained on the
training set only, and the default routing settings keep their held-out figures (measured with
benchmarks/routing.py, less a small margin)."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from gateway.config.routing import RoutingSettings
from gateway.routing.judge import Judge
from gateway.routing.scorer import SHIPPED
from testkit.routing_eval import (
    TRAIN,
    TRAIN_EXTRA,
    TRAIN_EXTRA2,
    Item,
    Report,
    by,
    load,
    verdicts,
)

LANGS = {"en", "zh", "ja", "ko", "de", "fr", "es", "pt", "ru"}
MARGIN = 0.02
# held out, as measured: overall, adversarial, not adversarial; fast sent to thinking, think
# sent to fast
OVERALL, ADVERSARIAL, PLAIN, FAST_ON, THINK_OFF = 0.935, 0.923, 0.950, 0.042, 0.087
PER_LANG = {
    "en": 0.932, "zh": 0.893, "ja": 0.952, "ko": 0.929, "de": 0.952, "fr": 0.953, "es": 0.976,
    "pt": 0.976, "ru": 0.929, "mixed": 1.0,
}  # fmt: skip


@pytest.fixture(scope="module")
def held() -> tuple[list[Item], list[bool]]:
    items = [i for i in load() if i.split == "heldout"]
    thinking = [v.thinking for v in verdicts(Judge(RoutingSettings()), items)]
    return items, thinking


def test_the_sets_cover_the_rubric_and_do_not_overlap() -> None:
    train, evaluation = load(TRAIN) + load(TRAIN_EXTRA) + load(TRAIN_EXTRA2), load()
    assert len(train) >= 2000 and {i.split for i in train} == {"train"}
    assert Counter(i.split for i in evaluation).keys() == {"tune", "heldout"}
    ids = [i.id for i in train + evaluation]
    assert len(set(ids)) == len(ids)
    for items in (train, evaluation):
        assert {i.lang for i in items} >= LANGS
        assert {i.client for i in items} >= {"plain", "cline", "claude-code", "codex"}
        labels = Counter(i.label for i in items)
        assert labels.keys() == {"think", "fast"} and min(labels.values()) >= len(items) // 3
        assert 0.3 <= sum(i.adversarial for i in items) / len(items) <= 0.7
        assert all(i.messages and i.messages[-1]["role"] in ("user", "tool") for i in items)
    # every language has enough held-out items to report it
    held = Counter(i.lang for i in evaluation if i.split == "heldout")
    assert all(held[lang] >= 30 for lang in LANGS), held


def test_the_shipped_model_was_trained_on_the_training_set() -> None:
    with gzip.open(SHIPPED, "rt", encoding="utf-8") as fh:
        trained = json.load(fh)["trained"]
    assert trained["items"] == len(load(TRAIN)) + len(load(TRAIN_EXTRA))


def test_held_out_agreement_stays_at_its_measured_level(
    held: tuple[list[Item], list[bool]],
) -> None:
    items, thinking = held
    overall = Report.of(items, thinking)
    assert overall.agreement >= OVERALL - MARGIN
    assert overall.fast_on <= FAST_ON + MARGIN
    assert overall.think_off <= THINK_OFF + MARGIN
    adversarial = by(items, thinking, "adversarial")
    assert adversarial["True"].agreement >= ADVERSARIAL - MARGIN
    assert adversarial["False"].agreement >= PLAIN - MARGIN
    langs = by(items, thinking, "lang")
    for lang, measured in PER_LANG.items():
        assert langs[lang].agreement >= measured - MARGIN, lang
