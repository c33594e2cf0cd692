"""PhraseIndex: one search says which kinds have a phrase in a text, exactly as `in` would."""

from __future__ import annotations

import random

from gateway.routing.phrases import PhraseIndex

KINDS = (("ab", "x^", "设计"), ("abc", "设计一个", "^2"), ("bcd", "d e", "√"), ("cd",))


def brute(lower: str) -> set[int]:
    return {k for k, phrases in enumerate(KINDS) if any(p in lower for p in phrases)}


def kinds_in(index: PhraseIndex, lower: str) -> set[int]:
    return index.kinds_in(lower, any("a" <= c <= "z" for c in lower))


def test_overlapping_phrases_and_prefixes_of_a_longer_one_all_count() -> None:
    index = PhraseIndex(KINDS)
    assert kinds_in(index, "abcd") == {0, 1, 2, 3}  # ab, abc, bcd and cd overlap
    assert kinds_in(index, "xabx") == {0}
    assert kinds_in(index, "设计一个系统") == {0, 1}  # 设计 is a prefix of 设计一个
    assert kinds_in(index, "x^2 and √") == {0, 1, 2}
    assert kinds_in(index, "ABC") == set()  # the caller lower-cases
    assert kinds_in(index, "") == set()


def test_random_texts_agree_with_substring_tests() -> None:
    index = PhraseIndex(KINDS)
    rng = random.Random(3)
    alphabet = "abcde ^2x√设计一个"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        assert kinds_in(index, text) == brute(text), text
