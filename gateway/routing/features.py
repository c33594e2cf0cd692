"""The features of an ask (`ask.Ask`) that the learned scorer weighs, as strings.

Every feature is present or absent (value 1); the scorer sums the weights of those present.
  w|<word>        English words of the instruction (lower-cased; a number reads as "0")
  b|<w1> <w2>     word bigrams
  p|<prefix>      the first 4 and 6 letters of words of 5 letters or more (stems: "prove",
                  "proof", "proving" share p|prov)
  f|<word>        the instruction's first word, and f2|<w1> <w2> its first two
  z|<chars>       CJK character 1- and 2-grams (Chinese has no spaces to split words by)
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

_TOKEN = re.compile(r"[a-z][a-z'_]*|\d+(?:\.\d+)?|[=+*/^<>%≤≥√∑∫π]|[\u3400-\u9fff]+")
_MAX_TOKENS = 60  # of the instruction (it is clipped to 300 characters already)
_MAX_CJK = 100  # CJK characters read (the cost per decision is bounded by these two)


def features(ask: Ask) -> list[str]:
    """The features of `ask` (duplicates possible; the scorer counts each once)."""
    out = [
        f"s|client={ask.client}",
        f"s|turn={ask.turn}",
        f"s|earlier={min(ask.earlier, 3)}",
        f"s|matsize={_log2_bucket(ask.material_chars)}",
    ]
    out.extend(f"s|mat={kind}" for kind in ask.material)
    text = ask.instruction.lower()
    if not text:
        out.append("s|empty")
        return out
    out.append(f"s|len={_log2_bucket(len(text))}")
    if "?" in text or "？" in text:
        out.append("s|q")
    tokens = _TOKEN.findall(text)[:_MAX_TOKENS]
    words: list[str] = []
    numbers = 0
    cjk = 0  # CJK characters read
    for token in tokens:
        first = token[0]
        if first >= "\u3400":  # a CJK run
            run = token[: max(_MAX_CJK - cjk, 0)]
            cjk += len(run)
            out.extend(["z|" + c for c in run])
            out.extend(["z|" + run[i : i + 2] for i in range(len(run) - 1)])
            words.append("<zh>")
        elif first.isdigit():
            numbers += 1
            words.append("0")
        elif first.isalpha():
            words.append(token)
            if len(token) >= 5:
                out.append("p|" + token[:4])
                out.append("p|" + token[:6])
        else:
            out.append("y|" + token)
    out.append(f"s|nums={min(numbers, 3)}")
    if words:
        out.append("f|" + words[0])
        if len(words) > 1:
            out.append(f"f2|{words[0]} {words[1]}")
    out.extend(["w|" + w for w in words])
    out.extend([f"b|{a} {b}" for a, b in zip(words, words[1:], strict=False)])
    return out


def _log2_bucket(n: int) -> int:
    """0 for 0, else 1 + floor(log2(n)), capped at 16."""
    return min(n.bit_length(), 16)
