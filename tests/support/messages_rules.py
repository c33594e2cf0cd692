"""A strict reader of Anthropic Messages streams for tests: every rule Claude Code and the
anthropic SDKs depend on (CLIENT-NOTES.md) is an assertion."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) per frame; every frame must have an `event:` line matching its data's
    `type`, and the body must end with a complete frame."""
    text = raw.decode()
    assert text.endswith("\n\n"), "the stream must end with a complete frame"
    events = []
    for frame in text.split("\n\n")[:-1]:
        lines = [ln for ln in frame.split("\n") if ln and not ln.startswith(":")]
        if not lines:
            continue
        assert len(lines) == 2, f"unexpected frame {frame!r}"
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        name, data = lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])
        assert data["type"] == name, f"event {name!r} carries a {data['type']!r}"
        events.append((name, data))
    return events


@dataclass
class MessagesStream:
    message: dict[str, Any] = field(default_factory=dict)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None


def check_messages_stream(raw: bytes) -> MessagesStream:
    """The stream's blocks put together. A stream may end in `error` instead of
    `message_delta` + `message_stop`; no block may be stopped after that."""
    events = sse_events(raw)
    out = MessagesStream(names=[name for name, _ in events])
    assert events and events[0][0] == "message_start", out.names
    out.message = events[0][1]["message"]
    assert out.message["content"] == [] and out.message["role"] == "assistant"
    out.usage = dict(out.message["usage"])
    open_index: int | None = None
    ended = False
    for name, data in events[1:]:
        assert not ended, f"{name} after the end of the message"
        if name == "ping":
            continue
        if name == "error":
            out.error = data["error"]
            ended = True
        elif name == "content_block_start":
            assert open_index is None, "a block started before the previous one stopped"
            assert data["index"] == len(out.blocks)
            block = dict(data["content_block"])
            block["_json"] = ""
            out.blocks.append(block)
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index
            _apply(out.blocks[open_index], data["delta"])
        elif name == "content_block_stop":
            assert data["index"] == open_index
            block = out.blocks[open_index]
            if block["type"] == "tool_use":
                block["input"] = json.loads(block["_json"])
                assert isinstance(block["input"], dict)
            if block["type"] == "thinking":
                assert block["signature"], "a thinking block needs its signature"
            open_index = None
        elif name == "message_delta":
            assert open_index is None, "message_delta with a block still open"
            out.stop_reason = data["delta"]["stop_reason"]
            out.usage.update(data["usage"])
        elif name == "message_stop":
            assert out.stop_reason is not None
            ended = True
        else:
            raise AssertionError(f"unknown event {name}")
    assert ended, "the stream ended without message_stop or error"
    for block in out.blocks:
        block.pop("_json")
    return out


def _apply(block: dict[str, Any], delta: dict[str, Any]) -> None:
    kind = delta["type"]
    if kind == "text_delta":
        assert block["type"] == "text"
        block["text"] += delta["text"]
    elif kind == "thinking_delta":
        assert block["type"] == "thinking" and not block["signature"]
        block["thinking"] += delta["thinking"]
    elif kind == "signature_delta":
        assert block["type"] == "thinking"
        block["signature"] = delta["signature"]
    elif kind == "input_json_delta":
        assert block["type"] == "tool_use"
        block["_json"] += delta["partial_json"]
    else:
        raise AssertionError(f"unknown delta {kind}")
