"""Incremental parser for DeepSeek-V3.1 tool calls in generated content.

The format, as the V3.1 chat template renders an assistant's calls:

    [content]<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(no separators between calls; ARGS is JSON). Content may arrive in any pieces, tags cut in two
included: text that may be the start of a tag is held back until the next piece or `finish`.
The events do not depend on how the text was cut (ids aside). Contracts:
- A call starts (`ToolCallStart`) once its name is complete; its arguments then stream as
  `ToolCallArgs` fragments as they arrive (leading whitespace dropped); a call whose arguments
  are empty gets the fragment "{}".
- Markup that does not parse (garbage between calls, a name without `<｜tool▁sep｜>`, a name
  that is empty, holds whitespace or runs over MAX_NAME_CHARS) turns back into content,
  verbatim. A call cut short (output ended, or the next call or `<｜tool▁calls▁end｜>` came
  without `<｜tool▁call▁end｜>`) is closed as it is.
- Whitespace-only content right before or after a tool-call section is dropped.
Nothing here raises on model output.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
MAX_NAME_CHARS = 256

_NAME_STOPS = (SEP, CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END)
_ARGS_STOPS = (CALL_END, CALL_BEGIN, CALLS_END)
_LONGEST_TAG = max(len(tag) for tag in _NAME_STOPS)


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int  # 0, 1, ... over the whole output
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgs:
    index: int
    fragment: str


ToolDelta = ContentDelta | ToolCallStart | ToolCallArgs


def new_call_id() -> str:
    """An OpenAI-style tool call id: "call_" and 24 URL-safe random characters."""
    return "call_" + secrets.token_urlsafe(18)


def _first_tag(text: str, tags: tuple[str, ...]) -> tuple[int, str] | None:
    """Position and tag of the earliest occurrence of any of `tags` in `text`."""
    found = [(i, tag) for tag in tags if (i := text.find(tag)) >= 0]
    return min(found) if found else None


def _partial_tag(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    if "<" not in text[-(_LONGEST_TAG - 1) :]:  # every tag starts with "<"
        return 0
    for n in range(min(_LONGEST_TAG - 1, len(text)), 0, -1):
        if any(tag.startswith(text[-n:]) for tag in tags):
            return n
    return 0


class _State(enum.Enum):
    TEXT = enum.auto()  # content; watching for CALLS_BEGIN
    CALLS = enum.auto()  # inside a section, between calls
    NAME = enum.auto()  # after CALL_BEGIN, until SEP
    ARGS = enum.auto()  # after SEP, until CALL_END


class ToolCallParser:
    """Feed content text; get content and tool-call events (see the module docstring)."""

    def __init__(self) -> None:
        self._state = _State.TEXT
        self._buf = ""  # text not decided yet
        self._raw = ""  # markup consumed that turns back into content if the call is malformed
        self._calls = 0  # calls started so far (the next call's index)
        self._section_calls = 0  # calls started in the current section
        self._args_seen = False  # the current call has had a non-empty fragment
        self._at_boundary = True  # no content since the output or a section began/ended
        self._held_ws = ""  # whitespace-only content held at a boundary

    def feed(self, text: str) -> list[ToolDelta]:
        self._buf += text
        out: list[ToolDelta] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[ToolDelta]:
        """End of output: decide everything held back."""
        out: list[ToolDelta] = []
        while self._step(out, final=True):
            pass
        return out

    def _step(self, out: list[ToolDelta], final: bool) -> bool:
        """Advance by one decision; False when more input is needed (or, final, all is done)."""
        if self._state is _State.TEXT:
            return self._step_text(out, final)
        if self._state is _State.CALLS:
            return self._step_calls(out, final)
        if self._state is _State.NAME:
            return self._step_name(out, final)
        return self._step_args(out, final)

    def _step_text(self, out: list[ToolDelta], final: bool) -> bool:
        idx = self._buf.find(CALLS_BEGIN)
        if idx >= 0:
            self._content(out, self._buf[:idx])
            self._held_ws = ""
            self._raw = CALLS_BEGIN
            self._buf = self._buf[idx + len(CALLS_BEGIN) :]
            self._state = _State.CALLS
            self._section_calls = 0
            return True
        keep = 0 if final else _partial_tag(self._buf, (CALLS_BEGIN,))
        self._content(out, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _step_calls(self, out: list[ToolDelta], final: bool) -> bool:
        rest = self._buf.lstrip()
        space = self._buf[: len(self._buf) - len(rest)]
        if rest.startswith(CALL_BEGIN):
            self._raw += space + CALL_BEGIN
            self._buf = rest[len(CALL_BEGIN) :]
            self._state = _State.NAME
            return True
        if rest.startswith(CALLS_END):
            self._buf = rest[len(CALLS_END) :]
            self._end_section()
            return True
        if not final and any(tag.startswith(rest) for tag in (CALL_BEGIN, CALLS_END)):
            return False
        if self._section_calls:
            self._end_section()
        else:
            self._degrade(out)
        return True

    def _step_name(self, out: list[ToolDelta], final: bool) -> bool:
        hit = _first_tag(self._buf, _NAME_STOPS)
        if hit is None:
            if not final and len(self._buf) < MAX_NAME_CHARS + _LONGEST_TAG:
                return False
            self._degrade(out)
            return True
        idx, tag = hit
        name = self._buf[:idx].strip()
        if tag != SEP or not name or idx > MAX_NAME_CHARS or any(c.isspace() for c in name):
            self._degrade(out)
            return True
        out.append(ToolCallStart(self._calls, new_call_id(), name))
        self._calls += 1
        self._section_calls += 1
        self._raw = ""
        self._args_seen = False
        self._buf = self._buf[idx + len(SEP) :]
        self._state = _State.ARGS
        return True

    def _step_args(self, out: list[ToolDelta], final: bool) -> bool:
        hit = _first_tag(self._buf, _ARGS_STOPS)
        if hit is None:
            keep = 0 if final else _partial_tag(self._buf, _ARGS_STOPS)
            self._args(out, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            if final:
                self._end_call(out)
                self._end_section()
                return True
            return False
        idx, tag = hit
        self._args(out, self._buf[:idx])
        self._end_call(out)
        self._buf = self._buf[idx + len(tag) :]
        if tag == CALL_END:
            self._state = _State.CALLS
        elif tag == CALL_BEGIN:
            self._raw = CALL_BEGIN
            self._state = _State.NAME
        else:
            self._end_section()
        return True

    def _content(self, out: list[ToolDelta], text: str) -> None:
        if self._at_boundary:
            self._held_ws += text
            if not self._held_ws.strip():
                return
            text, self._held_ws = self._held_ws, ""
            self._at_boundary = False
        if text:
            out.append(ContentDelta(text))

    def _args(self, out: list[ToolDelta], text: str) -> None:
        if not self._args_seen:
            text = text.lstrip()
        if text:
            self._args_seen = True
            out.append(ToolCallArgs(self._calls - 1, text))

    def _end_call(self, out: list[ToolDelta]) -> None:
        if not self._args_seen:
            out.append(ToolCallArgs(self._calls - 1, "{}"))

    def _end_section(self) -> None:
        self._state = _State.TEXT
        self._at_boundary = True
        self._held_ws = ""
        self._raw = ""

    def _degrade(self, out: list[ToolDelta]) -> None:
        """Malformed markup: what was consumed since the last good call becomes content."""
        out.append(ContentDelta(self._raw))  # never empty: it holds at least one tag
        self._raw = ""
        self._state = _State.TEXT
        self._at_boundary = False
