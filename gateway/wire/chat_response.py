"""Encode provider Events as OpenAI chat-completion SSE chunks or as one JSON body.

Stream rules (CLIENT-NOTES.md): every chunk has `choices`; the first delta carries
role "assistant"; exactly one chunk carries a finish_reason; then the usage chunk with
`"choices": []` when asked; then `data: [DONE]`. The first fragment of each tool call has id,
type, function.name; a call whose arguments never arrived gets "{}".
"""

from __future__ import annotations

import time
from typing import Any

from gateway.errors import GatewayError
from plumbing import jsoncodec
from providers.types import (
    Event,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it, their read timers restart


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + jsoncodec.dumps(obj) + b"\n\n"


def stream_tail(head: dict[str, Any], usage: Usage | None) -> list[bytes]:
    """The frames after the finish chunk: the usage chunk (`"choices": []`) when asked, then
    `[DONE]`. `usage` None: none was asked for."""
    if usage is None:
        return [DONE]
    return [sse({**head, "choices": [], "usage": usage_json(usage)}), DONE]


def usage_json(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "prompt_cache_hit_tokens": u.cached_prompt_tokens,
        "prompt_cache_miss_tokens": u.prompt_tokens - u.cached_prompt_tokens,
    }


class ChatStreamEncoder:
    """Stateful: feed Events in order with `encode`, then call `close` once."""

    def __init__(self, completion_id: str, model: str, include_usage: bool) -> None:
        self._head = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        self._include_usage = include_usage
        self._sent_role = False
        self._delta_frames: dict[str, tuple[bytes, bytes] | None] = {}
        self._finish: FinishReason | None = None
        self._usage: Usage | None = None
        self._args_seen: dict[int, bool] = {}

    @property
    def usage(self) -> Usage | None:
        return self._usage

    def _chunk(
        self,
        delta: dict[str, Any],
        finish: str | None = None,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> bytes:
        if not self._sent_role:
            delta = {"role": "assistant", **delta}
            self._sent_role = True
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": logprobs} if logprobs is not None else None,
            "finish_reason": finish,
        }
        return sse({**self._head, "choices": [choice]})

    def _text_chunk(self, field: str, text: str) -> bytes:
        """`_chunk({field: text})` once the role is out, built from the frame's bytes around
        its text (one JSON string encoded per chunk instead of the whole chunk)."""
        if not self._sent_role:
            return self._chunk({field: text})
        if field in self._delta_frames:
            around = self._delta_frames[field]
        else:
            around = self._delta_frames[field] = self._around(field)
        if around is None:
            return self._chunk({field: text})
        return around[0] + jsoncodec.dumps(text) + around[1]

    def _around(self, field: str) -> tuple[bytes, bytes] | None:
        """The bytes of a `{field: ...}` delta chunk before and after its text (None if the
        marker standing for the text were found elsewhere in the chunk too)."""
        marker = "\x00text\x00"
        parts = self._chunk({field: marker}).split(jsoncodec.dumps(marker))
        return (parts[0], parts[1]) if len(parts) == 2 else None

    def start(self) -> bytes:
        """The first chunk: role only (sent with the headers)."""
        return self._chunk({"content": ""})

    def keepalive(self) -> bytes:
        return KEEPALIVE

    def encode(self, event: Event) -> bytes | None:
        if isinstance(event, TextDelta):
            if event.logprobs is None:
                return self._text_chunk("content", event.text)
            return self._chunk({"content": event.text}, logprobs=event.logprobs)
        if isinstance(event, ReasoningDelta):
            return self._text_chunk("reasoning_content", event.text)
        if isinstance(event, ToolCallDelta):
            return self._chunk({"tool_calls": [self._tool_fragment(event)]})
        if isinstance(event, Usage):
            self._usage = event
            return None
        if isinstance(event, Finish):
            self._finish = event.reason
        return None

    def _tool_fragment(self, d: ToolCallDelta) -> dict[str, Any]:
        frag: dict[str, Any] = {"index": d.index, "function": {"arguments": d.arguments_fragment}}
        if d.index not in self._args_seen:
            frag["id"] = d.id or f"call_{d.index}"
            frag["type"] = "function"
            frag["function"]["name"] = d.name or ""
        self._args_seen[d.index] = self._args_seen.get(d.index, False) or bool(d.arguments_fragment)
        return frag

    def close(self, finish: FinishReason | None = None) -> list[bytes]:
        """Frames that end the stream: pending "{}" arguments, the finish chunk, usage, [DONE]."""
        frames: list[bytes] = []
        if not self._sent_role:
            frames.append(self.start())
        for index, seen in self._args_seen.items():
            if not seen:
                frames.append(
                    self._chunk({"tool_calls": [{"index": index, "function": {"arguments": "{}"}}]})
                )
        reason = finish or self._finish or ("tool_calls" if self._args_seen else "stop")
        frames.append(self._chunk({}, finish=reason))
        usage = (self._usage or Usage()) if self._include_usage else None
        return frames + stream_tail(self._head, usage)

    def fail(self, error: GatewayError) -> bytes:
        """A failure after the stream started: `data: {"error": {...}}`, and no [DONE]."""
        return sse(error.body())


class ChatAggregator:
    """Collects Events into one `chat.completion` body (non-streaming clients)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.logprobs: list[dict[str, Any]] | None = None
        self.finish: FinishReason | None = None
        self.usage = Usage()

    def add(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.text.append(event.text)
            if event.logprobs is not None:
                self.logprobs = (self.logprobs or []) + event.logprobs
        elif isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
        elif isinstance(event, ToolCallDelta):
            call = self.calls.setdefault(
                event.index,
                {
                    "id": event.id or f"call_{event.index}",
                    "type": "function",
                    "function": {"name": event.name or "", "arguments": ""},
                },
            )
            call["function"]["arguments"] += event.arguments_fragment
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Finish):
            self.finish = event.reason

    def body(self, completion_id: str, model: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            for call in self.calls.values():
                call["function"]["arguments"] = call["function"]["arguments"] or "{}"
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
            if not message["content"]:
                message["content"] = None
        finish = self.finish or ("tool_calls" if self.calls else "stop")
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish,
                    "logprobs": {"content": self.logprobs} if self.logprobs else None,
                }
            ],
            "usage": usage_json(self.usage),
        }


class ChatWire:
    """The chat-completions answer shape, for the pipeline."""

    endpoint = "chat.completions"
    id_prefix = "chatcmpl-"

    def __init__(self, include_usage: bool) -> None:
        self.include_usage = include_usage

    def stream_encoder(
        self, completion_id: str, model: str, prompt_tokens: int = 0
    ) -> ChatStreamEncoder:
        return ChatStreamEncoder(completion_id, model, self.include_usage)

    def aggregator(self) -> ChatAggregator:
        return ChatAggregator()
