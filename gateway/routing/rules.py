"""Named, versioned routing rules from settings; the first rule whose conditions all hold wins.

A rule's `thinking` is "on", "off", or "keep": the mode the conversation already has (from
stickiness); a "keep" rule falls through when the conversation has none. A decision by a rule is
explained as `rule:<name>@<version>`.
A rule's `pattern` is searched in the ask's instruction (`ask.Ask.instruction`: the user's own
words, without pasted material or the client's wrapper), case-insensitively; `turns` limits it to
new, continue or tool turns; `requires` names words of which one must occur in the ask before the
pattern is searched (a substring test costs far less than a search). Word boundaries and context
belong in the pattern: the defaults (gateway/config/routing_rules.py) match a request to prove at
the start of a sentence, not "the logs show that" or "who proved".

A match is read in its sentence: one inside quotation marks does not count (unless the rule says
`quoted`: "my teacher wrote \"prove it\" in the margin" asks nothing), nor one whose sentence,
or the sentence after it, holds the rule's `unless` pattern ("can you prove you're an AI? haha
just kidding", "format this proof in LaTeX" beside "check this proof"). The next match is tried.
"""

from __future__ import annotations

import re
from re import _constants as _c  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
from typing import Any, Literal

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
    unless: re.Pattern[str] | None
    quoted: bool
    requires: re.Pattern[str] | None  # the required words as one alternation
    min_prompt_tokens: int | None
    protocols: frozenset[str]
    turns: frozenset[str]

    @classmethod
    def of(cls, s: RuleSettings) -> Rule:
        pattern = _caseless(s.pattern) if s.pattern is not None else None
        unless = _caseless(s.unless) if s.unless is not None else None
        return cls(
            s.name,
            s.version,
            s.thinking,
            s.last_is_tool_result,
            s.has_tools,
            pattern,
            unless,
            s.quoted,
            _alternation(s.requires),
            s.min_prompt_tokens,
            frozenset(s.protocols),
            frozenset(s.turns),
        )

    @property
    def reason(self) -> str:
        return f"rule:{self.name}@{self.version}"

    def matches(
        self,
        request: ChatRequest,
        protocol: str,
        prompt_tokens: int,
        ask: Ask,
        lower: str | None = None,
        found: dict[re.Pattern[str], bool] | None = None,
    ) -> bool:
        """`lower`: the ask's instruction lower-cased, where the caller has it already; `found`:
        whether each `requires` pattern searched already was found (rules that require the same
        words search for them once)."""
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
        lower = ask.instruction.lower() if lower is None else lower
        if self.requires is not None:
            known = None if found is None else found.get(self.requires)
            if known is None:
                known = self.requires.search(lower) is not None
                if found is not None:
                    found[self.requires] = known
            if not known:
                return False
        if self.pattern is None:
            return True
        return self.found(lower)

    def found(self, text: str) -> bool:
        """Whether `pattern` matches `text` (lower-cased) somewhere that counts: outside
        quotation marks (unless `quoted`), in a sentence that, with the next one, does not hold
        `unless`."""
        assert self.pattern is not None
        for match in self.pattern.finditer(text):
            start = match.start()
            if not self.quoted and quoted_at(text, start):
                continue
            if self.unless is not None:
                begin, end = sentence_around(text, start, match.end())
                if self.unless.search(text, begin, end) is not None:
                    continue
            return True
        return False


def _caseless(pattern: str) -> re.Pattern[str]:
    """`pattern` for searching lower-cased text case-insensitively: compiled as it is when it
    has no upper-case letter outside its escapes (twice as fast as `re.IGNORECASE`), else with
    the flag. Where every match must start with one of a few known characters, a look-ahead for
    them goes first: the same matches, but the regex engine skips to those characters instead
    of trying each position (a pattern led by `\\b(?:check|verify|...)` is searched 2-5 times
    faster)."""
    letters = re.sub(r"\\.", "", pattern)
    if letters != letters.lower():
        return re.compile(pattern, re.IGNORECASE)
    compiled = re.compile(pattern)
    chars = _first_chars(pattern)
    if chars is None or len(chars) > _MAX_FIRST_CHARS:
        return compiled
    ahead = "".join(re.escape(c) for c in sorted(chars))
    return re.compile(f"(?=[{ahead}])(?:{pattern})")


_MAX_FIRST_CHARS = 64


def _first_chars(pattern: str) -> set[str] | None:
    """The characters a match of `pattern` can start with, None when that is not known (an
    anchor such as `^` first, a class such as `\\w`, an optional start) or the parser's
    internals differ."""
    try:
        return _first_of(_parser.parse(pattern))
    except Exception:  # the regex module's private parser: any surprise means "not known"
        return None


def _first_of(sub: Any) -> set[str] | None:
    out: set[str] = set()
    for op, arg in sub.data:
        if op in (_c.AT, _c.ASSERT, _c.ASSERT_NOT):
            if op is _c.AT and arg is not _c.AT_BOUNDARY and arg is not _c.AT_NON_BOUNDARY:
                return None  # ^, $, \A: the match may start anywhere they hold
            continue  # a word boundary or a look-around consumes nothing
        if op is _c.LITERAL:
            return {chr(arg)}
        if op is _c.IN:
            for item, value in arg:
                if item is _c.LITERAL:
                    out.add(chr(value))
                elif item is _c.RANGE and value[1] - value[0] <= _MAX_FIRST_CHARS:
                    out.update(chr(c) for c in range(value[0], value[1] + 1))
                else:
                    return None  # a negated class, a category, a wide range
            return out
        if op is _c.BRANCH:
            for alternative in arg[1]:
                first = _first_of(alternative)
                if first is None:
                    return None
                out |= first
            return out
        if op is _c.SUBPATTERN:
            return _first_of(arg[3])
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT) and arg[0] >= 1:
            return _first_of(arg[2])
        return None
    return None  # the pattern can match the empty string


def _alternation(words: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex that finds any of `words` (lower-cased, literally): one search in C instead of
    a substring test a word. Rules requiring the same words share the compiled pattern (the
    `re` module's cache), so the judge searches for them once."""
    if not words:
        return None
    return re.compile("|".join(re.escape(w.lower()) for w in sorted({w.lower() for w in words})))


# Where a sentence ends: ". ", "? ", "! " (not the dot of 3.14), or a CJK full stop, a line end.
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|[。！？\n]")
_QUOTE_PAIRS = {"“": "”", "‘": "’", "「": "」", "『": "』", "«": "»"}


def sentence_around(text: str, start: int, end: int) -> tuple[int, int]:
    """The span of the sentence holding text[start:end] and of the sentence after it."""
    begin = 0
    for boundary in _SENTENCE_END.finditer(text, 0, start):
        begin = boundary.end()
    stop = len(text)
    for n, boundary in enumerate(_SENTENCE_END.finditer(text, end)):
        if n == 1:
            stop = boundary.end()
            break
    return begin, stop


def quoted_at(text: str, pos: int) -> bool:
    """Whether `pos` lies inside quotation marks opened on its line: an odd number of straight
    double quotes before it, or a paired mark (“ 「 « ...) opened and not yet closed."""
    line_start = text.rfind("\n", 0, pos) + 1
    before = text[line_start:pos]
    if before.count('"') % 2 == 1:
        return True
    for opening, closing in _QUOTE_PAIRS.items():
        if opening in before and before.rfind(opening) > before.rfind(closing):
            return True
    return False


def compile_rules(settings: tuple[RuleSettings, ...]) -> tuple[Rule, ...]:
    return tuple(Rule.of(s) for s in settings)
