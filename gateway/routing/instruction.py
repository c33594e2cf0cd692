"""The instruction among a user text's prose paragraphs (what `pasted.py` left of it): all of
it when short; around a pasted document (titled, after a lead-in ending in a colon, after a
one-line ask, or opening the text as a mail or minutes), the words that ask. What is left out
is noted in the material kinds ("document", and "prose" when its lines are sentences)."""

from __future__ import annotations

import re

from gateway.routing.pasted import is_prose_line, pasted_kind

_ASK_END = frozenset(".?!。？！")
_QUESTION = re.compile(r"[?？]")
# A pasted document's title: in brackets (【重要】, [공지]), in capitals, or a name and a dash
# ("Compte rendu – Réunion ...", "Article 6 – Durée"), not ending as a sentence or a lead-in.
_TITLE = re.compile(r"\s*(?:[\[【〔「(]|[^a-z\n]{6,}$|[^\n]{3,60}\s[–—-]\s)")
_TITLE_NOT_END = frozenset(".?!。？！:：,，")
_LEAD_IN = re.compile(r"(?:[:：]|如下|below|following)\s*$", re.I)
_ASK_LINE = re.compile(r"[.?!。？！:：]\s*$")
_ATTACHED = re.compile(
    r"^\s*+(?:附件?|原文|正文|日志|以下是|attached|original|text|log|output)\s*[:：]", re.I
)


def _opens_with_prose(body: str) -> bool:
    """Whether the text opens with pasted prose: an e-mail header, a quoted line or a labelled
    sentence (a mail or minutes pasted first, the ask after them)."""
    head = body.lstrip()[:300].split("\n", 1)[0]
    return pasted_kind(head, 3) in ("prose", "quote")


def instruction_of(prose: list[str], kinds: set[str], body: str = "") -> str:
    """The instruction among the prose lines: all of it when short; in a long text, the first
    and last paragraphs (what sits between is a pasted document), and before a lead-in ending
    in a colon, only what leads in (and the last paragraph). After pasted prose that opens the
    text (`body`, the text the prose lines came from: a mail, minutes), the last paragraph."""
    paragraphs = [p.strip() for p in "\n".join(prose).split("\n\n") if p.strip()]
    if not paragraphs:
        return ""
    last = paragraphs[-1]
    if len(paragraphs) > 1 and len(last) <= 300 and _opens_with_prose(body):
        _left_out(paragraphs[0], kinds)
        return last
    titled = _titled_document(paragraphs)
    if titled is not None:
        _left_out(paragraphs[0], kinds)
        return titled
    if len(paragraphs) > 1 and _asks_then_pastes(paragraphs):
        _left_out(paragraphs[1], kinds)
        return paragraphs[0]
    if len(paragraphs) > 1 and len(last) <= 300:
        for n, paragraph in enumerate(paragraphs[:-2]):
            if _LEAD_IN.search(paragraph):  # "Here are the notes:", then the notes, then the ask
                _left_out(paragraphs[n + 1], kinds)
                return "\n".join([*paragraphs[: n + 1], last])
    first = paragraphs[0]
    lines = first.split("\n")
    rest = len(first) - len(lines[0])
    # a lead-in ("Hazme un CSV con esto:"), then text that asks nothing of its own
    lead_in = lines[0].rstrip().endswith((":", "：")) and not _QUESTION.search(first, len(lines[0]))
    if len(lines) > 1 and (rest > 150 or (lead_in and rest > 40)) and _ASK_LINE.search(lines[0]):
        # a one-line ask, then pasted text without a blank line between
        paragraphs = [lines[0], "\n".join(lines[1:]), *paragraphs[1:]]
        first = lines[0]
        _left_out(paragraphs[1], kinds)
        if lead_in:  # "Bitte die Kernaussagen als Stichpunkte:", then the text
            last = paragraphs[-1]
            return first + (f"\n{last}" if len(paragraphs) > 2 and len(last) <= 300 else "")
    text = "\n".join(paragraphs)
    lead = _lead_in_end(first)
    if lead is not None and len(first) - lead > 80:
        _left_out(first[lead:], kinds)
        after = [first[lead:].strip(), *paragraphs[1:]]
        last = after[-1]
        # the last paragraph is an ask of its own when the pasted text ended before it
        return first[:lead].strip() + (f"\n{last}" if len(after) > 1 and len(last) <= 300 else "")
    if len(paragraphs) == 1:
        return first
    if len(text) <= 400 and lead is None:
        return text
    _left_out(paragraphs[1], kinds)
    last = paragraphs[-1]
    if len(last) > 300 and _LEAD_IN.search(first.splitlines()[-1]):
        return first
    return f"{first}\n{last}" if len(last) <= 300 else first


def _titled_document(paragraphs: list[str]) -> str | None:
    """The ask after a pasted document that opens with a title ("AVISO A LOS VECINOS",
    "[공지] 사내 식당 운영 시간 변경", "Compte rendu – Réunion du 18 novembre"): its last paragraph,
    or with one paragraph its last line; None when the text does not open with a title."""
    first = paragraphs[0]
    title, _, body = first.partition("\n")
    if len(paragraphs) == 1 and body.count("\n") < 2:
        return None  # a title, then at least two lines of text and the ask
    if not _TITLE.match(title) or len(title) > 80 or title.rstrip()[-1] in _TITLE_NOT_END:
        return None
    if len(paragraphs) > 1:
        return paragraphs[-1] if len(paragraphs[-1]) <= 300 else None
    ask = first.rsplit("\n", 1)[1].strip()
    return ask if len(ask) <= 200 else None


def _asks_then_pastes(paragraphs: list[str]) -> bool:
    """A short ask that ends as a sentence ("Во сколько сбор?", "以下の連絡から集合時間だけ抜き出
    して。"), then longer prose with no question in it: the prose is what the ask is about. (A
    premise first and its question last stay one ask; so does a lead-in ending in a colon.)"""
    first = paragraphs[0]
    if len(first) > 200 or first[-1] not in _ASK_END:
        return False
    if sum(map(len, paragraphs[1:])) <= len(first):  # what is pasted is longer than the ask
        return False
    if any("?" in p or "？" in p for p in paragraphs[1:]):
        return False
    return is_prose_line(paragraphs[1].split("\n", 1)[0])


def _left_out(text: str, kinds: set[str]) -> None:
    """Note the kind of a pasted text left out of the instruction: a document, and prose when
    one of its first lines reads as a sentence (these lines are not code, logs or config)."""
    kinds.add("document")
    if any(is_prose_line(line) for line in text.lstrip().split("\n", 3)[:3]):
        kinds.add("prose")


def _lead_in_end(paragraph: str) -> int | None:
    """Where a lead-in line ("Here is the log:", "内容如下：") ends within the paragraph, when
    more text follows it."""
    offset = 0
    lines = paragraph.split("\n")
    for n, line in enumerate(lines[:-1]):
        if n > 0 and _ATTACHED.match(line):
            return offset  # "附：..." starts the attached text
        offset += len(line) + 1
        if _LEAD_IN.search(line) and len(line) <= 200:
            return offset
    return None
