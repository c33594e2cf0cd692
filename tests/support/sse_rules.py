"""A strict raw-SSE reader for tests: every stream rule of CLIENT-NOTES.md is an assertion."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


def sse_payloads(raw: bytes) -> list[str]:
    """The `data:` payloads of an SSE body, in order; frames must end in a blank line."""
    text = raw.decode()
    assert text.endswith("\n\n"), "the stream must end with a complete frame"
    payloads = []
    for frame in text.split("\n\n")[:-1]:
        lines = [ln for ln in frame.split("\n") if not ln.startswith(":")]
        if not lines:
            continue
        assert all(ln.startswith("data: ") for ln in lines), f"unexpected frame {frame!r}"
        payloads.append("\n".join(ln[len("data: ") :] for ln in lines))
    return payloads


@dataclass
class ChatStream:
    content: str = ""
    reasoning: str = ""
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    chunks: list[dict[str, Any]] = field(default_factory=list)


def check_chat_stream(raw: bytes, *, include_usage: bool) -> ChatStream:
    payloads = sse_payloads(raw)
    assert payloads and payloads[-1] == "[DONE]", "the stream must end with data: [DONE]"
    assert payloads.count("[DONE]") == 1
    out = ChatStream()
    finishes = 0
    for i, payload in enumerate(payloads[:-1]):
        chunk = json.loads(payload)
        out.chunks.append(chunk)
        assert "error" not in chunk, f"error frame: {chunk}"
        assert chunk["object"] == "chat.completion.chunk"
        assert isinstance(chunk.get("choices"), list), "every chunk needs a choices array"
        if not chunk["choices"]:
            assert include_usage and "usage" in chunk, "only the usage chunk has no choices"
            assert i == len(payloads) - 2, "the usage chunk comes last, right before [DONE]"
            out.usage = chunk["usage"]
            continue
        choice = chunk["choices"][0]
        delta = choice["delta"]
        if i == 0:
            assert delta.get("role") == "assistant", "the first delta carries the role"
        if choice.get("finish_reason"):
            finishes += 1
            out.finish_reason = choice["finish_reason"]
            assert out.finish_reason in ("stop", "length", "tool_calls", "content_filter")
        out.content += delta.get("content") or ""
        out.reasoning += delta.get("reasoning_content") or ""
        for frag in delta.get("tool_calls") or []:
            assert "function" in frag, "tool call fragments always include `function`"
            call = out.tool_calls.get(frag["index"])
            if call is None:
                assert frag.get("id", "").startswith("call_"), "first fragment needs an id"
                assert frag.get("type") == "function" and frag["function"].get("name")
                call = out.tool_calls[frag["index"]] = {
                    "id": frag["id"],
                    "name": frag["function"]["name"],
                    "arguments": "",
                }
            call["arguments"] += frag["function"].get("arguments") or ""
    assert finishes == 1, f"exactly one chunk carries finish_reason, saw {finishes}"
    if include_usage:
        assert out.usage is not None, "include_usage asked for a usage chunk"
    for call in out.tool_calls.values():
        assert call["arguments"], "every tool call gets a non-empty arguments fragment"
    return out
