"""Incremental parse of generated text into reasoning, content and tool calls.

Reasoning is split off by ThinkSplitter (a thinking prompt ends in `<think>`, so the output
starts inside reasoning); the content after it goes through ToolCallParser when tools are on.
Feed the detokenizer's text pieces in order; the deltas of one `feed` are merged where adjacent
and of the same kind. Concatenated per kind, the deltas do not depend on how the text was cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.text.think_splitter import Split, ThinkSplitter
from backend.text.tool_parser import ContentDelta, ToolCallArgs, ToolCallParser, ToolCallStart

__all__ = [
    "ContentDelta",
    "OutputParser",
    "ParsedDelta",
    "ParsedReasoning",
    "ToolCallArgs",
    "ToolCallStart",
]


@dataclass(frozen=True, slots=True)
class ParsedReasoning:
    text: str


ParsedDelta = ContentDelta | ParsedReasoning | ToolCallStart | ToolCallArgs


def _merge(deltas: list[ParsedDelta]) -> list[ParsedDelta]:
    """Join adjacent text deltas of one kind (and argument fragments of one call)."""
    out: list[ParsedDelta] = []
    for delta in deltas:
        last = out[-1] if out else None
        if isinstance(delta, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + delta.text)
        elif isinstance(delta, ParsedReasoning) and isinstance(last, ParsedReasoning):
            out[-1] = ParsedReasoning(last.text + delta.text)
        elif (
            isinstance(delta, ToolCallArgs)
            and isinstance(last, ToolCallArgs)
            and last.index == delta.index
        ):
            out[-1] = ToolCallArgs(delta.index, last.fragment + delta.fragment)
        else:
            out.append(delta)
    return out


class OutputParser:
    """One per generated sequence.

    `thinking`: the prompt ended in `<think>` (Tokenizer.prompt_opens_reasoning), so output
    starts as reasoning until `</think>`. `tools_enabled`: parse V3.1 tool calls in the content;
    without it, tool markup stays content.
    """

    def __init__(self, *, thinking: bool, tools_enabled: bool) -> None:
        self._splitter = ThinkSplitter(in_reasoning=thinking)
        self._tools = ToolCallParser() if tools_enabled else None

    def feed(self, text: str) -> list[ParsedDelta]:
        return self._route(self._splitter.feed(text), final=False)

    def finish(self) -> list[ParsedDelta]:
        """End of output: everything held back, decided."""
        return self._route(self._splitter.flush(), final=True)

    def _route(self, split: Split, *, final: bool) -> list[ParsedDelta]:
        out: list[ParsedDelta] = []
        if split.reasoning:
            out.append(ParsedReasoning(split.reasoning))
        if self._tools is None:
            if split.content:
                out.append(ContentDelta(split.content))
        else:
            out.extend(self._tools.feed(split.content))
            if final:
                out.extend(self._tools.finish())
        return _merge(out)
