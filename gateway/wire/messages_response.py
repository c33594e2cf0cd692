"""Encode provider Events as Anthropic Messages API stream events or as one `message` object.

Stream: `message_start` (input usage: the admission count, exact on the local engine) and a
`ping`; per content block `content_block_start`, its deltas and `content_block_stop` (every
block, in order); `message_delta` (stop_reason, and the final usage: input, cache reads, output)
and `message_stop`. Frames are `event: <type>\\ndata: <json>\\n\\n`; `ping` frames fill gaps. A
failure after the stream started is `event: error` with the error body, and no block still open
is stopped (so it cannot pass for finished).

Blocks: reasoning -> `thinking` (`thinking_delta`s, then a `signature_delta`: the provider's own
signature where it gave one, an Anthropic upstream's, else this gateway's; see
gateway/wire/thinking_signature.py); text -> `text` (`text_delta`); each tool call ->
`tool_use`, whose input is sent as one `input_json_delta` when the call is complete, checked to
be a JSON object (`{}` when the model's arguments were not one), since the clients parse every
fragment as partial JSON and fail on anything else.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from gateway.errors import GatewayError
from gateway.wire.messages_errors import anthropic_error
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

_STOP: dict[str, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


def frame(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + jsoncodec.dumps(event) + b"\n\n"


def usage_json(u: Usage) -> dict[str, int]:
    """Anthropic usage: `input_tokens` excludes the prompt tokens read from the cache."""
    return {
        "input_tokens": max(u.prompt_tokens - u.cached_prompt_tokens, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_prompt_tokens,
        "output_tokens": u.completion_tokens,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the JSON object Anthropic's `input` must be."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Block:
    def __init__(self, kind: str, index: int, call_id: str = "", name: str = "") -> None:
        self.kind = kind  # "text" | "thinking" | "tool_use"
        self.index = index
        self.call_id = call_id
        self.name = name
        self.signature: str | None = None  # the provider's own, for a thinking block
        self.pieces: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def start(self) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text", "text": ""}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": "", "signature": ""}
        return {"type": "tool_use", "id": self.call_id, "name": self.name, "input": {}}


class MessageBuilder:
    """Events -> stream events (dicts), and the content blocks of the final `message`.
    `sign` gives the signature of a thinking block's text."""

    def __init__(self, sign: Callable[[str], str]) -> None:
        self._sign = sign
        self.blocks: list[_Block] = []
        self._open: _Block | None = None
        self._calls: dict[int, _Block] = {}
        self.usage: Usage | None = None
        self.finish: FinishReason | None = None
        self.stop_sequence: str | None = None

    def feed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):
            return self._delta("text", event.text)
        if isinstance(event, ReasoningDelta):
            events = self._delta("thinking", event.text)
            if event.signature is not None and self._open and self._open.kind == "thinking":
                self._open.signature = event.signature
            return events
        if isinstance(event, ToolCallDelta):
            return self._tool(event)
        if isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Finish):
            self.finish, self.stop_sequence = event.reason, event.stop_sequence
        return []

    def _delta(self, kind: str, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        events = [] if self._open is not None and self._open.kind == kind else self._begin(kind)
        assert self._open is not None
        self._open.pieces.append(text)
        field = "text" if kind == "text" else "thinking"
        delta = {"type": f"{kind}_delta", field: text}
        return [*events, {"type": "content_block_delta", "index": self._open.index, "delta": delta}]

    def _tool(self, d: ToolCallDelta) -> list[dict[str, Any]]:
        block = self._calls.get(d.index)
        events: list[dict[str, Any]] = []
        if block is None:
            events = self._begin("tool_use", d.id or f"toolu_{uuid.uuid4().hex[:24]}", d.name or "")
            block = self._calls[d.index] = self.blocks[-1]
        block.pieces.append(d.arguments_fragment)
        return events

    def _begin(self, kind: str, call_id: str = "", name: str = "") -> list[dict[str, Any]]:
        events = self.stop_open()
        block = _Block(kind, len(self.blocks), call_id, name)
        self.blocks.append(block)
        self._open = block
        start = {"type": "content_block_start", "index": block.index}
        return [*events, {**start, "content_block": block.start()}]

    def stop_open(self) -> list[dict[str, Any]]:
        """The closing deltas and `content_block_stop` of the open block, if any."""
        block, self._open = self._open, None
        if block is None:
            return []
        events: list[dict[str, Any]] = []
        if block.kind == "thinking":
            delta = {"type": "signature_delta", "signature": self._signature(block)}
            events.append({"type": "content_block_delta", "index": block.index, "delta": delta})
        elif block.kind == "tool_use":
            partial = jsoncodec.dumps(tool_input(block.text)).decode()
            delta = {"type": "input_json_delta", "partial_json": partial}
            events.append({"type": "content_block_delta", "index": block.index, "delta": delta})
        return [*events, {"type": "content_block_stop", "index": block.index}]

    def _signature(self, block: _Block) -> str:
        return block.signature if block.signature is not None else self._sign(block.text)

    def stop_reason(self, finish: FinishReason | None = None) -> str:
        reason = finish or self.finish or "stop"
        if reason == "stop" and self._calls:
            reason = "tool_calls"
        if reason == "stop" and self.stop_sequence is not None:
            return "stop_sequence"
        return _STOP[reason]

    def matched_stop(self) -> str | None:
        """The stop sequence the answer ended on, when its stop reason says so."""
        return self.stop_sequence if self.stop_reason() == "stop_sequence" else None

    def content(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for block in self.blocks:
            if block.kind == "text":
                out.append({"type": "text", "text": block.text})
            elif block.kind == "thinking":
                signature = self._signature(block)
                out.append({"type": "thinking", "thinking": block.text, "signature": signature})
            else:
                call = {"type": "tool_use", "id": block.call_id, "name": block.name}
                out.append({**call, "input": tool_input(block.text)})
        return out


def _message(message_id: str, model: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }


class MessagesStreamEncoder:
    """Stateful: `start`, then `encode` each Event in order, then `close` (or `fail`) once."""

    def __init__(self, builder: MessageBuilder, message_id: str, model: str, prompt_tokens: int):
        self._builder = builder
        self._message = _message(message_id, model)
        self._prompt_tokens = prompt_tokens

    @property
    def usage(self) -> Usage | None:
        return self._builder.usage

    def start(self) -> bytes:
        usage = usage_json(Usage(prompt_tokens=self._prompt_tokens))
        start = {"type": "message_start", "message": {**self._message, "usage": usage}}
        return frame(start) + self.keepalive()

    def keepalive(self) -> bytes:
        return frame({"type": "ping"})

    def encode(self, event: Event) -> bytes | None:
        return b"".join(frame(e) for e in self._builder.feed(event)) or None

    def close(self, finish: FinishReason | None = None) -> list[bytes]:
        builder = self._builder
        events = builder.stop_open()
        usage = builder.usage or Usage(prompt_tokens=self._prompt_tokens)
        reason = builder.stop_reason(finish)
        stop = builder.matched_stop() if reason == "stop_sequence" else None
        delta = {"stop_reason": reason, "stop_sequence": stop}
        events.append({"type": "message_delta", "delta": delta, "usage": usage_json(usage)})
        events.append({"type": "message_stop"})
        return [b"".join(frame(e) for e in events)]

    def fail(self, error: GatewayError) -> bytes:
        return frame(anthropic_error(error.status, error.message))


class MessagesAggregator:
    """Collects Events into one `message` object (non-streaming clients)."""

    def __init__(self, builder: MessageBuilder, model: str) -> None:
        self._builder = builder
        self._model = model
        self.usage = Usage()

    def add(self, event: Event) -> None:
        self._builder.feed(event)
        if isinstance(event, Usage):
            self.usage = event

    def body(self, completion_id: str, model: str) -> dict[str, Any]:
        builder = self._builder
        return {
            **_message(completion_id, self._model),
            "content": builder.content(),
            "stop_reason": builder.stop_reason(),
            "stop_sequence": builder.matched_stop(),
            "usage": usage_json(self.usage),
        }


class MessagesWire:
    """The Messages API answer shape, for the pipeline. `model` is the id the client asked for
    (echoed even when a model pattern mapped it to a gateway model)."""

    endpoint = "messages"
    id_prefix = "msg_"
    include_usage = True

    def __init__(self, model: str, sign: Callable[[str], str]) -> None:
        self.model = model
        self._sign = sign

    def stream_encoder(
        self, completion_id: str, model: str, prompt_tokens: int = 0
    ) -> MessagesStreamEncoder:
        return MessagesStreamEncoder(
            MessageBuilder(self._sign), completion_id, self.model, prompt_tokens
        )

    def aggregator(self) -> MessagesAggregator:
        return MessagesAggregator(MessageBuilder(self._sign), self.model)
