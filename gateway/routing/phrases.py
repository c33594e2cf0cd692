"""Which kinds of marker phrase occur in a text, every kind at once, in one left-to-right search.

`PhraseIndex` holds phrases (lower-case literals: words, stems, CJK terms, symbols), each of one
or more kinds (numbered 0..n-1). `kinds_in(lower, latin)` is exactly the set of kinds with a
phrase that is a substring of `lower`, as testing each phrase with `in` would say, at a cost that
grows with the text's length, not with the number of phrases times its length:
  - the phrases are compiled into one regex shaped as a trie (an alternation per shared prefix,
    greedy), so a search tries the phrases starting at a position together and, where any does,
    matches the longest one;
  - the search is run again from one character after each match's start, so every position where
    a phrase starts is seen; every other phrase starting there is a prefix of the longest one, so
    each phrase's kinds include those of its prefixes that are phrases.
A phrase with a Latin letter cannot occur in a text without one, nor a non-ASCII phrase in an
ASCII text: there is one regex per script (2 if the text has a Latin letter, plus 1 if it has a
non-ASCII character), over the phrases that script allows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_LATIN = re.compile(r"[a-z]")
_Trie = dict[str, "_Trie"]  # a character -> the node after it; "" marks a phrase's end


class PhraseIndex:
    def __init__(self, kinds: Iterable[Iterable[str]]) -> None:
        """`kinds`: the phrases of kind 0, of kind 1, ..."""
        kinds_of: dict[str, set[int]] = {}
        for kind, phrases in enumerate(kinds):
            for phrase in phrases:
                kinds_of.setdefault(phrase, set()).add(kind)
        self._by_script = tuple(
            _Script({p: k for p, k in kinds_of.items() if _allowed(p, script)})
            for script in range(4)
        )

    def kinds_in(self, lower: str, latin: bool) -> set[int]:
        """The kinds with a phrase in `lower`, a lower-cased text; `latin`: whether it has a
        letter a-z."""
        script = (2 if latin else 0) + (0 if lower.isascii() else 1)
        return self._by_script[script].kinds_in(lower)


def _allowed(phrase: str, script: int) -> bool:
    """Whether `phrase` may occur in a text of `script` (see the module)."""
    latin = _LATIN.search(phrase) is not None
    return bool(script & 2 or not latin) and bool(script & 1 or phrase.isascii())


class _Script:
    """The phrases one script allows: the trie regex and each phrase's kinds, its prefixes'
    included."""

    __slots__ = ("_kinds", "_searches")

    def __init__(self, kinds_of: dict[str, set[int]]) -> None:
        self._kinds = {
            phrase: frozenset().union(*(k for p, k in kinds_of.items() if phrase.startswith(p)))
            for phrase in kinds_of
        }
        groups: dict[str, list[str]] = {}
        for phrase in kinds_of:
            groups.setdefault(_group(phrase[0]), []).append(phrase)
        self._searches = tuple(re.compile(_trie_pattern(g)).search for g in groups.values())

    def kinds_in(self, lower: str) -> set[int]:
        found: set[int] = set()
        kinds = self._kinds
        for search in self._searches:
            match = search(lower)
            while match is not None:
                found |= kinds[match.group()]
                match = search(lower, match.start() + 1)
        return found


def _group(first: str) -> str:
    """Phrases are searched in two groups, by whether their first character is ASCII: each a
    regex whose first-character set lets the search skip the positions where none of its
    phrases starts (the CJK ones skip an English text's), and whose alternation at a position
    stays short."""
    return "ascii" if first.isascii() else "other"


def _trie_pattern(phrases: list[str]) -> str:
    """A regex matching exactly `phrases` (non-empty literals), preferring the longest one."""
    trie: _Trie = {}
    for phrase in phrases:
        node = trie
        for char in phrase:
            node = node.setdefault(char, {})
        node[""] = {}  # a phrase ends here
    return _node_pattern(trie)


def _node_pattern(node: _Trie) -> str:
    """The regex of a trie node's continuations: its children, optional where a phrase ends
    at the node (greedy, so the longest continuation is tried first)."""
    children = [re.escape(c) + _node_pattern(child) for c, child in sorted(node.items()) if c]
    if not children:
        return ""
    group = children[0] if len(children) == 1 else "(?:" + "|".join(children) + ")"
    if "" not in node:
        return group
    return f"(?:{group})?"
