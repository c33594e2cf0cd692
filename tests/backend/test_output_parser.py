"""OutputParser: reasoning, content and V3.1 tool calls, however the text is cut."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from backend.text.detokenizer import IncrementalDetokenizer
from backend.text.output_parser import (
    ContentDelta,
    OutputParser,
    ParsedDelta,
    ParsedReasoning,
    ToolCallArgs,
    ToolCallStart,
)
from backend.text.tokenizer import Tokenizer
from backend.text.tokenizer_assets import write_tokenizer_files
from backend.text.tool_parser import MAX_NAME_CHARS

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


def call(name: str, args: str) -> str:
    return f"{CALL_BEGIN}{name}{SEP}{args}{CALL_END}"


@dataclass
class Result:
    content: str = ""
    reasoning: str = ""
    calls: list[list[str]] = field(default_factory=list)  # [name, arguments]
    ids: list[str] = field(default_factory=list)


def collect(deltas: list[ParsedDelta]) -> Result:
    result = Result()
    for delta in deltas:
        match delta:
            case ContentDelta(text):
                result.content += text
            case ParsedReasoning(text):
                result.reasoning += text
            case ToolCallStart(index, call_id, name):
                assert index == len(result.calls)
                result.calls.append([name, ""])
                result.ids.append(call_id)
            case ToolCallArgs(index, fragment):
                assert fragment and index == len(result.calls) - 1
                result.calls[index][1] += fragment
    return result


def parse(pieces: list[str], *, thinking: bool = False, tools: bool = True) -> Result:
    parser = OutputParser(thinking=thinking, tools_enabled=tools)
    deltas: list[ParsedDelta] = []
    for piece in pieces:
        deltas += parser.feed(piece)
    return collect(deltas + parser.finish())


def cuts(text: str) -> list[list[str]]:
    """The text whole, one character at a time, and in random pieces."""
    rng = random.Random(len(text))
    variants = [[text], list(text)]
    for _ in range(20):
        points = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        variants.append(
            [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
        )
    return variants


def parse_all_ways(text: str, **kwargs: bool) -> Result:
    results = [parse(pieces, **kwargs) for pieces in cuts(text)]
    for other in results[1:]:
        assert (other.content, other.reasoning, other.calls) == (
            results[0].content,
            results[0].reasoning,
            results[0].calls,
        )
    return results[0]


def test_reasoning_then_content() -> None:
    r = parse_all_ways("Let me think.\nOK.</think>The answer is 4.", thinking=True)
    assert (r.reasoning, r.content, r.calls) == ("Let me think.\nOK.", "The answer is 4.", [])


def test_without_thinking_everything_is_content() -> None:
    r = parse_all_ways("Plain answer, no </think> magic.", thinking=False, tools=False)
    assert (r.reasoning, r.content) == ("", "Plain answer, no </think> magic.")


def test_several_calls_stream_with_ids() -> None:
    text = (
        "Checking both."
        + CALLS_BEGIN
        + call("get_weather", '{"city": "Zürich", "q": "<b>"}')
        + call("now", "")
        + call("search", '  {"q": "café \\"best\\""}')
        + CALLS_END
    )
    r = parse_all_ways(text)
    assert r.content == "Checking both."
    assert r.calls == [
        ["get_weather", '{"city": "Zürich", "q": "<b>"}'],
        ["now", "{}"],
        ["search", '{"q": "café \\"best\\""}'],
    ]
    assert all(re.fullmatch(r"call_[A-Za-z0-9_-]{24}", i) for i in r.ids)
    assert len(set(r.ids)) == 3


def test_arguments_stream_as_they_arrive() -> None:
    parser = OutputParser(thinking=False, tools_enabled=True)
    (start,) = parser.feed("Sure." + CALLS_BEGIN + CALL_BEGIN + "f" + SEP)[1:]
    assert isinstance(start, ToolCallStart) and (start.index, start.name) == (0, "f")
    assert parser.feed('{"a": ') == [ToolCallArgs(0, '{"a": ')]
    assert parser.feed("1}<｜tool") == [ToolCallArgs(0, "1}")]  # a possible tag is held back
    assert parser.feed("▁call▁end｜>" + CALLS_END) == []
    assert parser.finish() == []


def test_thinking_then_tool_call() -> None:
    text = "Need the time.</think>\n\n" + CALLS_BEGIN + call("now", "{}") + CALLS_END + "\n"
    r = parse_all_ways(text, thinking=True)
    assert (r.reasoning, r.content, r.calls) == ("Need the time.", "", [["now", "{}"]])


def test_content_after_calls_is_kept() -> None:
    r = parse_all_ways(CALLS_BEGIN + call("f", "{}") + CALLS_END + " Done.")
    assert (r.content, r.calls) == (" Done.", [["f", "{}"]])


def test_truncated_call_is_closed_as_is() -> None:
    r = parse_all_ways("x" + CALLS_BEGIN + call("a", "{}") + CALL_BEGIN + "b" + SEP + '{"k": 1')
    assert (r.content, r.calls) == ("x", [["a", "{}"], ["b", '{"k": 1']])


def test_missing_call_end_before_next_call_or_section_end() -> None:
    text = CALLS_BEGIN + CALL_BEGIN + "a" + SEP + "{}" + CALL_BEGIN + "b" + SEP + "[]" + CALLS_END
    r = parse_all_ways(text)
    assert (r.content, r.calls) == ("", [["a", "{}"], ["b", "[]"]])


@pytest.mark.parametrize(
    "text",
    [
        CALLS_BEGIN + "garbage" + CALLS_END,
        CALLS_BEGIN + CALL_BEGIN + "no separator" + CALL_END + CALLS_END,
        CALLS_BEGIN + CALL_BEGIN + "f" * (MAX_NAME_CHARS + 1) + SEP + "{}" + CALL_END,
        CALLS_BEGIN + CALL_BEGIN + SEP + "{}" + CALL_END,
        CALLS_BEGIN + CALL_BEGIN + "name cut short",
        CALLS_BEGIN,
    ],
)
def test_malformed_markup_degrades_to_content(text: str) -> None:
    r = parse_all_ways("Hi " + text)
    assert (r.content, r.calls) == ("Hi " + text, [])


def test_garbage_after_good_calls_is_content() -> None:
    r = parse_all_ways(CALLS_BEGIN + call("a", "{}") + "oops" + call("b", "{}"))
    assert r.calls == [["a", "{}"]]
    assert r.content == "oops" + call("b", "{}")


def test_tool_markup_is_content_when_tools_are_off() -> None:
    text = "Hi" + CALLS_BEGIN + call("a", "{}") + CALLS_END
    r = parse_all_ways(text, tools=False)
    assert (r.content, r.calls) == (text, [])


def test_lookalike_text_is_content() -> None:
    text = "a <｜tool▁calls▁beg b <｜tool and <think> </thin"
    assert parse_all_ways(text).content == text


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path: Path = tmp_path_factory.mktemp("v31-tokenizer")
    write_tokenizer_files(path)
    return Tokenizer.from_dir(path)


def test_token_by_token_from_the_detokenizer(tok: Tokenizer) -> None:
    text = (
        "Hmm, 天气? 😀</think>Let me look."
        + CALLS_BEGIN
        + call("get_weather", '{"city": "北京"}')
        + CALLS_END
    )
    ids = [*tok.encode(text), tok.special.eos]
    detok = IncrementalDetokenizer(tok)
    token_pieces = [detok.push(i) for i in ids] + [detok.flush()]
    r = parse(token_pieces, thinking=True)
    assert r == Result(
        content="Let me look.",
        reasoning="Hmm, 天气? 😀",
        calls=[["get_weather", '{"city": "北京"}']],
        ids=r.ids,
    )
    whole = parse([text], thinking=True)
    assert (whole.content, whole.reasoning, whole.calls) == (r.content, r.reasoning, r.calls)
