"""Incremental split of generated text into reasoning and content at `<think>` / `</think>`.

Used for the local engine's output (a V3.1 thinking prompt ends in `<think>`, so generation starts
inside reasoning) and for upstreams that inline reasoning in content. Text may arrive in any
pieces, even a tag cut in two: a possible tag prefix at the end of a piece is held back until the
next piece (or `flush`) decides it. Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


@dataclass(frozen=True, slots=True)
class Split:
    reasoning: str = ""
    content: str = ""


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkSplitter:
    """Feed text pieces; get back what is known to be reasoning and what is content.

    `in_reasoning=True` starts inside a reasoning block (the prompt ended in `<think>`).
    With `in_reasoning=False`, a `<think>` that opens the output (after optional whitespace)
    starts reasoning; a `<think>` later in the content is content.
    """

    def __init__(self, in_reasoning: bool = False) -> None:
        self._in_reasoning = in_reasoning
        self._seen_output = in_reasoning  # once content has started, <think> is plain text
        self._done = False  # reasoning closed: everything after is content
        self._pending = ""

    @property
    def in_reasoning(self) -> bool:
        return self._in_reasoning

    def feed(self, text: str) -> Split:
        buf = self._pending + text
        self._pending = ""
        reasoning: list[str] = []
        content: list[str] = []
        while buf:
            if self._done:
                content.append(buf)
                break
            if self._in_reasoning:
                idx = buf.find(CLOSE_TAG)
                if idx >= 0:
                    reasoning.append(buf[:idx])
                    buf = buf[idx + len(CLOSE_TAG) :]
                    self._in_reasoning = False
                    self._done = True
                    continue
                keep = _partial_suffix(buf, CLOSE_TAG)
                reasoning.append(buf[: len(buf) - keep])
                self._pending = buf[len(buf) - keep :]
                break
            if self._seen_output:
                content.append(buf)
                break
            stripped = buf.lstrip()
            if not stripped:
                self._pending = buf
                break
            if stripped.startswith(OPEN_TAG):
                buf = stripped[len(OPEN_TAG) :]
                self._in_reasoning = True
                self._seen_output = True
                continue
            if OPEN_TAG.startswith(stripped):
                self._pending = buf
                break
            self._seen_output = True
            self._done = True
        return Split("".join(reasoning), "".join(content))

    def flush(self) -> Split:
        """End of output: whatever was held back is emitted as what it would have been."""
        pending, self._pending = self._pending, ""
        if not pending:
            return Split()
        if self._in_reasoning:
            return Split(reasoning=pending)
        return Split(content=pending)
