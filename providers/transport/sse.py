"""Server-sent events: an incremental parser for upstream bytes.

The parser follows the SSE format as upstreams use it: lines end in `\\n` or `\\r\\n` (a lone
`\\r` is not a line end), `:` starts a comment (`: keep-alive`), a blank line ends an event,
several `data:` lines of one event are joined with `\\n`, `id:`/`retry:`/unknown fields are
ignored, and an event without data lines is dropped. Bytes may be cut anywhere, even inside a
UTF-8 character or between `\\r` and `\\n`. `[DONE]` is an ordinary data payload here; the
caller decides what it means.
"""

from __future__ import annotations

from plumbing.record import record


@record
class SSEEvent:
    data: str
    event: str = "message"


class SSEParser:
    """Feed byte chunks in arrival order; get back the events they complete."""

    __slots__ = ("_partial", "_data", "_event")

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # bytes of the current, unfinished line
        self._data: str | None = None  # data lines of the current event, joined
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if b"\n" not in chunk:
            if chunk:
                self._partial.append(chunk)
            return []
        if self._partial:
            self._partial.append(chunk)
            chunk = b"".join(self._partial)
            self._partial.clear()
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if rest:
            self._partial.append(rest)
        events: list[SSEEvent] = []
        for line in lines:
            # The lines nearly every upstream sends, inline; `_line` for the rest.
            if line.startswith(b"data: ") and not line.endswith(b"\r"):
                text = line[6:].decode("utf-8", "replace")
                self._data = text if self._data is None else self._data + "\n" + text
            elif not line:
                if self._data is not None:
                    events.append(SSEEvent(self._data, self._event or "message"))
                    self._data = None
                self._event = None
            else:
                self._line(line, events)
        return events

    def flush(self) -> list[SSEEvent]:
        """End of input: an unterminated last line and event are taken as complete."""
        events: list[SSEEvent] = []
        if self._partial:
            line = b"".join(self._partial)
            self._partial.clear()
            self._line(line, events)
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[SSEEvent]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            if self._data is not None:
                events.append(SSEEvent(self._data, self._event or "message"))
            self._data = None
            self._event = None
            return
        if line[0] == 0x3A:  # ":" comment
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            text = value.decode("utf-8", "replace")
            self._data = text if self._data is None else self._data + "\n" + text
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
