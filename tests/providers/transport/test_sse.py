from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from providers.transport.sse import SSEEvent, SSEParser

STREAM = (
    b": keep-alive\n\n"
    b"\n"
    b'data: {"a": "h\xc3\xa9llo"}\n\n'
    b"event: ping\r\ndata: first\r\ndata: second\r\n\r\n"
    b"id: 7\nretry: 100\ndata:no-space\n\n"
    b"event: lonely\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent('{"a": "héllo"}'),
    SSEEvent("first\nsecond", "ping"),
    SSEEvent("no-space"),
    SSEEvent("[DONE]"),
]


def parse_pieces(pieces: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    return events + parser.flush()


def test_whole_stream() -> None:
    assert parse_pieces([STREAM]) == EXPECTED


def test_byte_by_byte() -> None:
    assert parse_pieces([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_cut_points_give_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    pieces = [STREAM[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert parse_pieces(pieces) == EXPECTED


def test_events_are_returned_as_soon_as_complete() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: one\n") == []
    assert parser.feed(b"\ndata: tw") == [SSEEvent("one")]
    assert parser.feed(b"o\r") == []
    assert parser.feed(b"\n\r\n") == [SSEEvent("two")]


def test_flush_completes_an_unterminated_event() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]") == []
    assert parser.flush() == [SSEEvent("[DONE]")]
    assert parser.flush() == []


def test_empty_data_line_is_an_event_and_comments_are_not() -> None:
    assert parse_pieces([b"data\n\n: x\n\n"]) == [SSEEvent("")]


@given(st.lists(st.text().map(lambda t: t.replace("\r", "").replace("\n", "")), min_size=1))
def test_multi_line_data_round_trips(lines: list[str]) -> None:
    frame = "".join(f"data: {line}\r\n" for line in lines) + "\r\n"
    assert parse_pieces([b": keep-alive\n\n", frame.encode()]) == [SSEEvent("\n".join(lines))]


def reference(stream: bytes) -> list[SSEEvent]:
    """The format's rules, written out plainly (the whole stream at once, then flushed)."""
    events: list[SSEEvent] = []
    data: list[str] | None = None
    name: str | None = None
    for raw in stream.split(b"\n"):
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if not line:
            if data is not None:
                events.append(SSEEvent("\n".join(data), name or "message"))
            data, name = None, None
        elif not line.startswith(b":"):
            field, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if field == b"data":
                data = [*(data or []), value.decode("utf-8", "replace")]
            elif field == b"event":
                name = value.decode("utf-8", "replace")
    if data is not None:
        events.append(SSEEvent("\n".join(data), name or "message"))
    return events


LINES = st.sampled_from(
    [b"data: x", b"data:y", b"data:  two spaces", b"data: \xc3\xa9", b"data: a\r", b"data:",
     b"", b"\r", b": comment", b"event: ping", b"event:e\r", b"id: 1", b"retry: 5", b"datax: no"]
)  # fmt: skip


@given(st.lists(LINES, max_size=30), st.lists(st.integers(min_value=0, max_value=400)))
def test_any_lines_cut_anywhere_follow_the_rules(lines: list[bytes], cuts: list[int]) -> None:
    stream = b"\n".join(lines) + b"\n"
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    pieces = [stream[a:b] for a, b in zip(points, points[1:], strict=False)]
    assert parse_pieces(pieces) == reference(stream)
