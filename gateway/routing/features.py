"""The features of an ask (`ask.Ask`) that the learned scorer weighs, as strings.

Every feature is present or absent (value 1); the scorer sums the weights of those present.
  w|<word>        English words of the instruction (lower-cased; a number reads as "0")
  p|<prefix>      the first 4 letters of words of 5 letters or more (stems: "prove",
                  "proof", "proving" share p|prov)
  f|<word>        the instruction's first word, and f2|<w1> <w2> its first two (the opening
                  phrase: "how many", "show that"; bigrams further in weighed too little in
                  cross-validation for what they cost)
  z|<chars>       CJK character 1- and 2-grams of the first 32 CJK characters (Chinese has no
                  spaces to split words by)
  y|<symbol>      maths and code symbols (= + * / ^ < > % ≤ ≥ √ ∑ ∫ π)
  s|...           structure: the client (s|client=cline), the turn kind (s|turn=new), earlier
                  user turns (s|earlier=0..3), each material kind (s|mat=log), the material's
                  size and the instruction's length as log2 buckets (s|matsize=k, s|len=k), how
                  many numbers it holds (s|nums=0..3), a question mark (s|q), no instruction
                  at all (s|empty)
The trainer (`train.py`) hashes these strings into buckets (the hashing trick); the shipped
weights map each string seen in training to its bucket's weight, so an unseen string weighs 0.
"""

from __future__ import annotations

import re

from gateway.routing.ask import Ask

# A token: a word ([a-z][a-z'_]*), a number (\d+(?:\.\d+)?), a symbol or a CJK run. Written
# as its first character, then how each kind goes on: a regex that starts with one character
# class skips the text between tokens at C speed (4x faster than four alternatives there).
_TOKEN = re.compile(
    r"[a-z\d=+*/^<>%≤≥√∑∫π\u3400-\u9fff]"
    r"(?:(?<=[a-z])[a-z'_]*|(?<=\d)\d*(?:\.\d+)?|(?<=[\u3400-\u9fff])[\u3400-\u9fff]*|)"
)
_MAX_TOKENS = 40  # of the instruction (it is clipped to 300 characters already)
_MAX_CJK = 32  # CJK characters read (the cost per decision is bounded by these two)
# A character that no token continues across (it may start one), and where it is looked for.
_NOT_IN_TOKEN = re.compile(r"[^a-z'_.\d\u3400-\u9fff]")
_HEAD_CHARS = 160


Group = tuple[str, list[str]]  # a prefix ("w|", ...) and the keys after it


def features(ask: Ask) -> list[str]:
    """The features of `ask` as strings (duplicates possible; each counts once)."""
    return [prefix + key for prefix, keys in groups(ask) for key in keys]


def groups(ask: Ask) -> list[Group]:
    """The features of `ask` by prefix, unjoined: what the scorer looks up, one table a prefix,
    without building a string per feature."""
    structure = [
        f"client={ask.client}",
        f"turn={ask.turn}",
        f"earlier={min(ask.earlier, 3)}",
        f"matsize={_log2_bucket(ask.material_chars)}",
    ]
    structure.extend([f"mat={kind}" for kind in ask.material])
    out: list[Group] = [("s|", structure)]
    text = ask.instruction.lower()
    if not text:
        structure.append("empty")
        return out
    structure.append(f"len={_log2_bucket(len(text))}")
    if "?" in text or "？" in text:
        structure.append("q")
    words: list[str] = []
    symbols: list[str] = []
    cjk: list[str] = []
    numbers = 0
    budget = _MAX_CJK  # CJK characters still to read
    add_word = words.append
    for token in _tokens(text):
        first = token[0]
        if first < "\u3400":
            if first.isalpha():
                add_word(token)
            elif first.isdigit():
                numbers += 1
                add_word("0")
            else:
                symbols.append(token)
        else:  # a CJK run
            add_word("<zh>")
            if budget:
                run = token[:budget]
                budget -= len(run)
                cjk += run
                cjk += map(str.__add__, run, run[1:])
    prefixes = [w[:4] for w in words if len(w) >= 5]  # "<zh>" and "0" are shorter
    structure.append(f"nums={min(numbers, 3)}")
    out.append(("z|", cjk))
    out.append(("p|", prefixes))
    out.append(("y|", symbols))
    if words:
        out.append(("f|", words[:1]))
        if len(words) > 1:
            out.append(("f2|", [f"{words[0]} {words[1]}"]))
        out.append(("w|", words))
    return out


def _tokens(text: str) -> list[str]:
    """The first `_MAX_TOKENS` tokens of `text`. A long text's head is read first, up to a
    character that no token continues across, and the rest only when the head holds too few."""
    if len(text) > _HEAD_CHARS and (cut := _NOT_IN_TOKEN.search(text, _HEAD_CHARS)) is not None:
        tokens = _TOKEN.findall(text, 0, cut.start())
        if len(tokens) < _MAX_TOKENS:
            tokens += _TOKEN.findall(text, cut.start())
        return tokens[:_MAX_TOKENS]
    return _TOKEN.findall(text)[:_MAX_TOKENS]


def _log2_bucket(n: int) -> int:
    """0 for 0, else 1 + floor(log2(n)), capped at 16."""
    return min(n.bit_length(), 16)
