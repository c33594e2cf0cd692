"""The features of an ask (`ask.Ask`) that the learned scorer weighs, as strings.

Every occurrence of a feature counts (a word twice, its weight twice); the scorer sums their
weights. The instruction is read normalised (full-width letters, digits and maths symbols as
their ordinary forms, "？" as "?"; lower-cased; every number as "0"), in any script:
  w|<word>        words of the instruction (letters of any script but the ones written
                  without spaces; the first 40 tokens)
  g|<chars>       character 3-grams of each of those words of 4 letters or more, a space
                  before and after it included ("beweis", "beweise", "beweisen" share g| be,
                  g|bew, g|ewe, ...: they carry across inflections and languages that share
                  roots, where a word list would not); `word_grams`. The scorer weighs a word
                  and its 3-grams together, once per distinct word it has seen
  f|<word>        the instruction's first word, and f2|<w1> <w2> its first two
  z|<chars>       1- and 2-grams of the first 32 characters of the scripts written without
                  spaces (Chinese, Japanese kana, Korean syllables)
  y|<symbol>      maths and code symbols (= + * / ^ < > % ≤ ≥ √ ∑ ∫ π)
  s|...           structure, in no language's words: the client (s|client=cline), the turn kind
                  (s|turn=new), earlier user turns (s|earlier=0..3), each material kind
                  (s|mat=log, s|mat=prose), the material's size and the instruction's length
                  as log2 buckets (s|matsize=k, s|len=k), the script the words are in
                  (s|script=latin|cyrillic|han|kana|hangul|other), how many numbers
                  (s|nums=0..5), numbers followed by a word (quantities: "5 hours", "3 个",
                  s|qty=0..3), sentence stops (s|stops=0..4), a question mark (s|q) and a
                  question at the end (s|qend), laughter (s|laugh: "lol", 哈哈, ㅋㅋ, 😂), list
                  items (s|items), no instruction at all (s|empty)
  x|<m>|<f>       the material's class (prose, tech, none: `material_class`) with the first
                  word, the length bucket and a question mark: "translate"
                  over prose is not "translate" over code, a question about code is not one
                  about a notice
The trainer (`train.py`) hashes these strings into buckets (the hashing trick); the shipped
weights map each string seen in training to its bucket's weight, so an unseen string weighs 0.
"""

from __future__ import annotations

import re

from gateway.routing.ask import Ask

# Scripts written without spaces between words: CJK ideographs, kana, Hangul syllables.
_DENSE = "\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff"
# A token: a number, a maths symbol, a run of dense-script characters, or a word of letters.
# The first alternative that applies wins; letters exclude digits, "_" and the dense scripts.
# Full-width letters, digits and maths symbols (what NFKC would fold that the features read; the
# full-width punctuation of CJK text, far more common, is left alone: folding it all cost more
# than the rest of the features together).
_WIDE = re.compile("[\uff05\uff0a\uff0b\uff0f-\uff19\uff1c-\uff1e\uff21-\uff3a\uff3e\uff41-\uff5a]")
_NARROW = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}
_TOKEN = re.compile(
    rf"\d+(?:[.,]\d+)*|[=+*/^<>%≤≥√∑∫π]|[{_DENSE}]+|[^\W\d_{_DENSE}][^\W\d_{_DENSE}']*"
)
# The same on ASCII text (most English asks), three times faster than the Unicode classes.
_ASCII_TOKEN = re.compile(r"[a-z]+|\d+(?:[.,]\d+)*|[=+*/^<>%]")
_MAX_TOKENS = 40  # of the instruction (it is clipped to 300 characters already)
_BREAK = re.compile("[\\s\u3001\u3002\uff0c]")  # no token holds these
_HEAD_CHARS = 160  # characters of a long instruction tokenized first (`_tokens`)
_MAX_DENSE = 32  # dense-script characters read (the cost per decision is bounded by these)
_ITEM = re.compile(r"(?m)^\s*(?:[-*•]|\d+[.)]|\(?[a-z]\))\s")
TECH = frozenset({"code", "log", "trace"})


Group = tuple[str, list[str]]  # a prefix ("w|", ...) and the keys after it


def features(ask: Ask) -> list[str]:
    """The features of `ask` as strings, each as often as it occurs: `groups`, and after each
    word its 3-grams."""
    out: list[str] = []
    for prefix, keys in groups(ask):
        for key in keys:
            out.append(prefix + key)
            if prefix == "w|":
                out.extend(["g|" + gram for gram in word_grams(key)])
    return out


def word_grams(word: str) -> list[str]:
    """The character 3-grams of a word of 4 letters or more, a space before and after it
    included; none for a shorter word, a number ("0") or a dense-script run ("<cjk>")."""
    if len(word) < 4 or word[0] == "<":
        return []
    padded = f" {word} "
    return [padded[i : i + 3] for i in range(len(padded) - 2)]


def material_class(material: tuple[str, ...]) -> str:
    """ "tech" when the ask carries code, logs or traces, or configuration without prose; "prose"
    when it carries prose (mail, minutes, articles, notices: their "Date: 9 May" lines read as
    configuration); else "none" (context or tool results only)."""
    if TECH.intersection(material):
        return "tech"
    if "prose" in material:
        return "prose"
    return "tech" if "config" in material else "none"


def groups(ask: Ask) -> list[Group]:
    """The features of `ask` by prefix, unjoined, without the words' 3-grams: what the scorer
    looks up, one table a prefix, without building a string per feature."""
    structure = [
        f"client={ask.client}",
        f"turn={ask.turn}",
        f"earlier={min(ask.earlier, 3)}",
        f"matsize={_log2_bucket(ask.material_chars)}",
    ]
    structure.extend([f"mat={kind}" for kind in ask.material])
    out: list[Group] = [("s|", structure)]
    mclass = material_class(ask.material)
    if not ask.instruction:
        structure.append("empty")
        out.append(("x|", [f"{mclass}|empty"]))
        return out
    text = ask.instruction
    ascii_ = text.isascii()
    if not ascii_ and _WIDE.search(text) is not None:
        text = text.translate(_NARROW)  # rare: CJK punctuation is left as it is
    text = text.lower()
    length = f"len={_log2_bucket(len(text))}"
    structure.append(length)
    question = "?" in text or (not ascii_ and "？" in text)
    if question:
        structure.append("q")
        if text.rstrip().endswith(("?", "？")):
            structure.append("qend")
    if _LAUGH.search(text) is not None:
        structure.append("laugh")
    # sentence stops (a decimal point aside)
    stops = sum(map(text.count, ".?!" if ascii_ else ".?!。？！"))
    structure.append(f"stops={min(stops, 4)}")
    if "\n" in text and _ITEM.search(text):
        structure.append("items")
    words: list[str] = []  # every token, a number as "0", a dense run as "<cjk>"
    symbols: list[str] = []
    dense: list[str] = []
    numbers = quantities = 0
    budget = _MAX_DENSE  # dense-script characters still to read
    after_number = False
    for token in _tokens(text):
        first = token[0]
        if first >= "a":  # a word: letters sort after digits and the ASCII symbols
            if first >= "\u3040" and _is_dense(first):
                words.append("<cjk>")
                if budget:
                    run = token[:budget]
                    budget -= len(run)
                    dense += run
                    dense += map(str.__add__, run, run[1:])
            elif first in "≤≥√∑∫π":
                symbols.append(token)
                after_number = False
                continue
            else:
                words.append(token)
            if after_number:
                quantities += 1
                after_number = False
        elif first <= "9" and first >= "0":
            numbers += 1
            words.append("0")
            after_number = True
        else:
            symbols.append(token)
            after_number = False
    structure.append(f"nums={min(numbers, 5)}")
    structure.append(f"qty={min(quantities, 3)}")
    structure.append(f"script={_script(text, words, dense)}")
    first_word = words[0] if words else "-"
    crossed = [f"{mclass}|{first_word}", f"{mclass}|{length}"]
    if question:
        crossed.append(f"{mclass}|q")
    out.append(("x|", crossed))
    out.append(("z|", dense))
    out.append(("y|", symbols))
    if words:
        out.append(("f|", words[:1]))
        if len(words) > 1:
            out.append(("f2|", [f"{words[0]} {words[1]}"]))
        out.append(("w|", words))
    return out


_KANA = re.compile("[\u3040-\u30ff]")
# Laughter and "just kidding", as people write it in any language: banter, not a task.
_LAUGH = re.compile(  # one group of literals: the regex engine skips to their first letters
    r"(?:lol|lmao|haha|hehe|jaja|kkkk|mdr|хаха|哈哈|ㅋㅋ|笑|😂|🤣|😄|🙄|kidding|jk\b)"
)


def _is_dense(char: str) -> bool:
    return (
        "\u3040" <= char <= "\u30ff"
        or "\u3400" <= char <= "\u9fff"
        or "\uac00" <= char <= "\ud7af"
        or "\uf900" <= char <= "\ufaff"
    )


def _script(text: str, words: list[str], dense: list[str]) -> str:
    """The instruction's script (kana anywhere reads as Japanese; else the first dense-script
    character read, else the first word of letters): what a language's prior can hang on
    without naming the language."""
    if dense:
        if _KANA.search(text) is not None:
            return "kana"
        return "hangul" if "\uac00" <= dense[0] <= "\ud7af" else "han"
    for word in words:
        char = word[0]
        if char.isalpha():
            if char < "\u0250":
                return "latin"
            return "cyrillic" if "\u0400" <= char <= "\u04ff" else "other"
    return "none"


def _tokens(text: str) -> list[str]:
    """The first `_MAX_TOKENS` tokens of `text` (lower-cased). A long text's head is read first,
    up to a character that no token holds (a blank, "、", "。", "，"), and the rest only when the
    head holds too few."""
    token = _ASCII_TOKEN if text.isascii() else _TOKEN
    if len(text) > _HEAD_CHARS and (cut := _BREAK.search(text, _HEAD_CHARS)) is not None:
        tokens = token.findall(text, 0, cut.start())
        if len(tokens) < _MAX_TOKENS:
            tokens += token.findall(text, cut.start())
        return tokens[:_MAX_TOKENS]
    return token.findall(text)[:_MAX_TOKENS]


def _log2_bucket(n: int) -> int:
    """0 for 0, else 1 + floor(log2(n)), capped at 16."""
    return min(n.bit_length(), 16)
