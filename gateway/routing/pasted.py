"""Pasted material inside a user's text, found without reading it all: fenced blocks, XML-like
document blocks, and pasted lines (log lines, stack frames, quoted lines, code, `key: value`
configuration, e-mail headers and labelled sentences such as "ACTION: Ana to send the deck").
Of a long text only the lines at its ends are read one by one (an ask sits before or after what
it carries), and a few lines of its middle tell prose (mail, minutes, articles, notices) from
code, logs and configuration. `ask.py` keeps what is left as the instruction."""

from __future__ import annotations

import re

EDGE_LINES = 8  # lines read one by one at each end of a long text
SAMPLE_LINES = 4  # lines of a long text's middle read to tell prose from code, logs, config

_DOC_BLOCK = re.compile(
    r"<(document|file|log|logs|email|mail|article|text|notes|code|config|diff|output|source)"
    r"\b[^>]*>.*?(?:</\1>|\Z)",
    re.S,
)
_PROSE_BLOCKS = ("<document", "<email", "<mail", "<article", "<text", "<notes")

# Pasted lines, each kind by what follows the line's leading blanks.
_LOG_HEAD = (
    r"\[?\d{4}[-/]\d\d[-/]\d\d|\[?\d\d:\d\d:\d\d|\d{10,}|\[?(?:DEBUG|INFO|WARN|WARNING"
    r"|ERROR|FATAL|TRACE|CRITICAL|E\d{4}|I\d{4}|W\d{4})\b"
)
_TRACE_HEAD = (
    r"at [\w.$<>]+\(|File \"[^\"]+\", line \d|Traceback \(most recent|"
    r"goroutine \d+|thread '[^']*' panicked|#\d+ 0x|"
    r"\w++(?:\.\w++)*+(?:(?<=Error)|(?<=Exception)): "  # a dotted name ending in Error: ...
)
_QUOTE_HEAD = r">|\|"
_MAIL_HEAD = (
    r"(?i:From|To|Cc|Subject|Date|Sent|Von|An|Betreff|De|Para|Objet|Asunto|Assunto|От|Кому|Тема"
    r"|发件人|收件人|主题|抄送|日期|件名|差出人|宛先|보낸 사람|받는 사람|제목)\s*[:：]"
)
_LINE_HEAD = re.compile(  # trace, log, quote and mail lines: one match
    rf"\s*+(?:(?P<trace>{_TRACE_HEAD})|(?P<log>{_LOG_HEAD})|(?P<quote>{_QUOTE_HEAD})"
    rf"|(?P<prose>{_MAIL_HEAD}))"
)
_LOG_LINE = re.compile(rf"\s*+(?:{_LOG_HEAD})")
# `key: value`, or a key alone ("server:"; a few words and a colon alone are a lead-in:
# "Check my proof:"). The words are matched possessively: no blank, ":" or "=" is in them, so
# giving letters back could not make a match, only cost the tries.
_CONFIG_LINE = re.compile(
    r"^\s*+(?:- )?[\w.\-\"']{1,30}+(?:(?: [\w.\-]{1,20}+){0,2}\s*[:=]\s*\S|\s*[:=]\s*$)"
)
# A code line: indented, or ending in ; { or } (checked on the line's end, not by a regex), or
# led by a keyword; and not ending like a sentence.
_CODE_START = re.compile(r"\s*+(?:def |class |import |from \S+ import |#include|//)")
_CODE_END, _SENTENCE_END = ";{}", ".?!。？！"
_CJK = re.compile(r"[\u3400-\u9fff]")
_DENSE = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")  # CJK, kana, Hangul
# The value of a `key: value` line that is a sentence, not a setting ("ACTION: Ana to send the
# deck by Friday"): several words.
_SENTENCE_VALUE = re.compile(r"[:=]\s*+(?:[^\W\d_][^\s=/{}\[\]\"]*\s+){3}")


def remove_fences(text: str) -> tuple[str, str]:
    """`text` without its fenced blocks (from a ``` line to the next ``` or the end), and their
    bodies joined: what a regex with a lazy body does, by `str.find` (it is 20x faster on a long
    paste)."""
    kept: list[str] = []
    bodies: list[str] = []
    pos = 0
    while (start := text.find("```", pos)) != -1:
        line_end = text.find("\n", start + 3)
        body_start = len(text) if line_end == -1 else line_end + 1
        end = text.find("```", body_start)
        end = len(text) if end == -1 else end
        kept.append(text[pos:start])
        bodies.append(text[body_start:end])
        pos = min(end + 3, len(text))
    kept.append(text[pos:])
    return "\n".join(kept), "\n".join(bodies)


def remove_documents(text: str) -> tuple[str, str]:
    """`text` without its document blocks (each from its opening tag to its closing tag or the
    end, tags included), and the blocks joined: the material they carry."""
    blocks: list[str] = []

    def cut(match: re.Match[str]) -> str:
        blocks.append(match.group())
        return "\n"

    return _DOC_BLOCK.sub(cut, text), "\n".join(blocks)


def code_kind(code: str) -> str:
    """A fenced block's kind: "log" when its first line reads as a log line, else "code"."""
    return "log" if _LOG_LINE.match(code) else "code"


def document_kind(block: str) -> str:
    """A document block's kind: "prose" for a document, mail, article, text or notes block,
    else "document" (code, configuration, diffs, output by their tag)."""
    return "prose" if block.startswith(_PROSE_BLOCKS) else "document"


def is_prose_line(line: str) -> bool:
    """A line of sentences: not pasted (`pasted_kind`), and words between spaces or a run of
    CJK text."""
    stripped = line.strip()
    if len(stripped) < 16:
        return False
    return stripped.count(" ") >= 3 or _DENSE.search(stripped[:4]) is not None


def split_lines(body: str, kinds: set[str]) -> tuple[list[str], int]:
    """The prose lines (blank lines kept as paragraph breaks) and the pasted lines' size. Of a
    text of many lines only the first and last `EDGE_LINES` are read line by line (an ask
    sits before or after what it carries); the lines between are pasted material, measured
    without being split."""
    newlines = body.count("\n")
    if newlines < 3 * EDGE_LINES:
        lines = body.split("\n")
        pasted = 0
    else:
        *head, rest = body.split("\n", EDGE_LINES)
        middle, *tail = rest.rsplit("\n", EDGE_LINES)
        kinds.add("document")
        if _prose_middle(middle):
            kinds.add("prose")
        lines = [*head, "", *tail]
        pasted = len(middle) + 1  # its lines and their line ends
    num_lines = newlines + 1
    prose: list[str] = []
    for line in lines:
        kind = pasted_kind(line, num_lines)
        if kind is None:
            prose.append(line)
        else:
            kinds.add(kind)
            pasted += len(line) + 1
    return prose, pasted


def _prose_middle(middle: str) -> bool:
    """Whether the first `SAMPLE_LINES` non-blank lines of a long text's middle are mostly
    prose (read one by one; the rest is not read)."""
    sample = [line for line in middle[:2000].split("\n", 3 * SAMPLE_LINES) if line.strip()]
    sample = sample[:SAMPLE_LINES]
    prose = 0
    for line in sample:
        kind = pasted_kind(line, SAMPLE_LINES)
        prose += kind == "prose" or (kind is None and is_prose_line(line))
    return 2 * prose > len(sample)


def pasted_kind(line: str, num_lines: int) -> str | None:
    if not line or line.isspace():
        return None
    head = _LINE_HEAD.match(line)  # trace, log, quote and mail lines: one match
    if head is not None:
        return head.lastgroup
    if num_lines <= 2:
        return None
    end = line.rstrip()[-1]  # the line is not blank
    if end not in _SENTENCE_END and (
        end in _CODE_END or line.startswith(("    ", "\t")) or _CODE_START.match(line)
    ):
        return "code"
    if (
        len(line) < 120
        and ("=" in line or ":" in line)
        and _CONFIG_LINE.match(line)
        and not _CJK.search(line[:8])
    ):
        return "prose" if _SENTENCE_VALUE.search(line) else "config"
    return None
