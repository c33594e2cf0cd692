"""Encode provider Events as OpenAI Responses API stream events or as one `response` object.

Stream (CLIENT-NOTES.md, Codex CLI): `response.created` and `response.in_progress`; then per
output item `response.output_item.added` before any of its deltas (a message also gets
`response.content_part.added` before its text and `.done` after), its `.done` events, and
`response.output_item.done` with the full item; last `response.completed` with the full response
and usage (status "incomplete" with `incomplete_details` when the output was cut short). Every
event carries `type` and an increasing `sequence_number`; frames are
`event: <type>\\ndata: <json>\\n\\n`. A failure after the stream started is `response.failed`:
items still open then get no `.done` events (Codex would keep a partial message as finished and
resend it on every retry) and stand in the failed response with status "incomplete". A long
silence gets another `response.in_progress` (Codex's idle timer restarts only on events).

Output items: reasoning (`summary` text and, for the next turn, the whole reasoning in
`encrypted_content`), message (one output_text part), function_call (`call_id` is the provider's
tool call id; namespaced tools get their client-side name and `namespace` back).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from gateway.errors import GatewayError
from gateway.wire.responses_request import ToolName, encode_reasoning
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

_ID_PREFIX = {"message": "msg", "reasoning": "rs", "function_call": "fc"}
_INCOMPLETE: dict[str, str] = {"length": "max_output_tokens", "content_filter": "content_filter"}


def usage_json(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total_tokens,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class _Item:
    """One output item: "message", "reasoning" or "function_call", at `index` in the output."""

    def __init__(self, kind: str, index: int, item_id: str, call_id: str, name: ToolName) -> None:
        self.kind = kind
        self.index = index
        self.id = item_id
        self.call_id = call_id
        self.name = name
        self.pieces: list[str] = []  # text, reasoning or arguments fragments
        self.status = "in_progress"

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def body(self) -> dict[str, Any]:
        """The item as it stands: empty while just added, full once done."""
        text, open_ = self.text, self.status == "in_progress"
        head = {"id": self.id, "type": self.kind, "status": self.status}
        if self.kind == "message":
            content = [] if open_ and not text else [_text_part(text)]
            return {**head, "role": "assistant", "content": content}
        if self.kind == "reasoning":
            summary = [{"type": "summary_text", "text": text}] if text else []
            blob = encode_reasoning(text) if text else None
            return {**head, "summary": summary, "encrypted_content": blob}
        call = {
            **head,
            "call_id": self.call_id,
            "name": self.name.name,
            "arguments": text or ("" if open_ else "{}"),
        }
        if self.name.namespace is not None:
            call["namespace"] = self.name.namespace
        return call


class ResponseBuilder:
    """Turns Events into Responses stream events (dicts without `sequence_number`) and keeps the
    output items for the final `response` object."""

    def __init__(self, echo: dict[str, Any], tool_names: dict[str, ToolName]) -> None:
        self._echo = echo
        self._tool_names = tool_names
        self._token = uuid.uuid4().hex[:24]
        self.items: list[_Item] = []
        self._open: list[_Item] = []
        self._calls: dict[int, _Item] = {}  # provider tool call index -> its item
        self.usage: Usage | None = None
        self.finish: FinishReason | None = None

    def feed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):
            return self._text("message", event.text)
        if isinstance(event, ReasoningDelta):
            return self._text("reasoning", event.text)
        if isinstance(event, ToolCallDelta):
            return self._tool(event)
        if isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Finish):
            self.finish = event.reason
        return []

    def close(self, finish: FinishReason | None) -> list[dict[str, Any]]:
        """Done events for every open item; `finish` (when given) overrides the provider's."""
        self.finish = finish or self.finish
        return self._close_open(self.final_status())

    def fail(self) -> None:
        """Open items end "incomplete", with no done events: they are not finished items."""
        for item in self._open:
            item.status = "incomplete"
        self._open = []

    def final_status(self) -> str:
        """The response's status: cut short (length, content_filter) or not."""
        return "incomplete" if self.finish in _INCOMPLETE else "completed"

    def response(self, head: dict[str, Any], status: str) -> dict[str, Any]:
        """The `response` object; `head` holds id, object, created_at and model."""
        reason = _INCOMPLETE.get(self.finish or "")
        return {
            **head,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "output": [item.body() for item in self.items],
            **self._echo,
            "usage": None if status == "in_progress" else usage_json(self.usage or Usage()),
        }

    def _text(self, kind: str, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        events: list[dict[str, Any]] = []
        if not (len(self._open) == 1 and self._open[0].kind == kind):
            events += self._close_open("completed")
            events += self._add(kind, "", ToolName(""))
        item = self._open[0]
        item.pieces.append(delta)
        ref = {"item_id": item.id, "output_index": item.index}
        if kind == "message":
            events.append(
                {
                    "type": "response.output_text.delta",
                    **ref,
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": [],
                }
            )
        else:
            events.append(
                {
                    "type": "response.reasoning_summary_text.delta",
                    **ref,
                    "summary_index": 0,
                    "delta": delta,
                }
            )
        return events

    def _tool(self, d: ToolCallDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self._calls.get(d.index)
        if item is None:
            if any(i.kind != "function_call" for i in self._open):
                events += self._close_open("completed")
            flat = d.name or ""
            name = self._tool_names.get(flat, ToolName(flat))
            events += self._add("function_call", d.id or f"call_{d.index}", name)
            item = self._calls[d.index] = self._open[-1]
        if d.arguments_fragment:
            item.pieces.append(d.arguments_fragment)
            if item.status == "in_progress":
                events.append(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": item.id,
                        "output_index": item.index,
                        "delta": d.arguments_fragment,
                    }
                )
        return events

    def _add(self, kind: str, call_id: str, name: ToolName) -> list[dict[str, Any]]:
        index = len(self.items)
        item = _Item(kind, index, f"{_ID_PREFIX[kind]}_{self._token}_{index}", call_id, name)
        self.items.append(item)
        self._open.append(item)
        events = [
            {"type": "response.output_item.added", "output_index": index, "item": item.body()}
        ]
        ref = {"item_id": item.id, "output_index": index}
        if kind == "message":
            events.append(
                {
                    "type": "response.content_part.added",
                    **ref,
                    "content_index": 0,
                    "part": _text_part(""),
                }
            )
        elif kind == "reasoning":
            events.append(
                {
                    "type": "response.reasoning_summary_part.added",
                    **ref,
                    "summary_index": 0,
                    "part": {"type": "summary_text", "text": ""},
                }
            )
        return events

    def _close_open(self, status: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for item in self._open:
            item.status = status
            events += self._done(item)
        self._open = []
        return events

    def _done(self, item: _Item) -> list[dict[str, Any]]:
        ref = {"item_id": item.id, "output_index": item.index}
        body = item.body()
        events: list[dict[str, Any]]
        if item.kind == "message":
            part = _text_part(item.text)
            events = [
                {
                    "type": "response.output_text.done",
                    **ref,
                    "content_index": 0,
                    "text": item.text,
                    "logprobs": [],
                },
                {"type": "response.content_part.done", **ref, "content_index": 0, "part": part},
            ]
        elif item.kind == "reasoning":
            part = {"type": "summary_text", "text": item.text}
            events = [
                {
                    "type": "response.reasoning_summary_text.done",
                    **ref,
                    "summary_index": 0,
                    "text": item.text,
                },
                {
                    "type": "response.reasoning_summary_part.done",
                    **ref,
                    "summary_index": 0,
                    "part": part,
                },
            ]
        else:
            events = [
                {
                    "type": "response.function_call_arguments.done",
                    **ref,
                    "name": body["name"],
                    "arguments": body["arguments"],
                }
            ]
        events.append(
            {"type": "response.output_item.done", "output_index": item.index, "item": body}
        )
        return events


def _head(response_id: str, model: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model}


class ResponsesStreamEncoder:
    """Stateful: `start`, then `encode` each Event in order, then `close` (or `fail`) once."""

    def __init__(self, builder: ResponseBuilder, response_id: str, model: str) -> None:
        self._builder = builder
        self._head = _head(response_id, model)
        self._sequence = 0

    @property
    def usage(self) -> Usage | None:
        return self._builder.usage

    def _frames(self, events: list[dict[str, Any]]) -> bytes:
        out: list[bytes] = []
        for event in events:
            kind = event["type"]
            payload = {"type": kind, "sequence_number": self._sequence, **event}
            self._sequence += 1
            out.append(f"event: {kind}\ndata: ".encode() + jsoncodec.dumps(payload) + b"\n\n")
        return b"".join(out)

    def start(self) -> bytes:
        response = self._builder.response(self._head, "in_progress")
        return self._frames(
            [
                {"type": "response.created", "response": response},
                {"type": "response.in_progress", "response": response},
            ]
        )

    def keepalive(self) -> bytes:
        response = self._builder.response(self._head, "in_progress")
        return self._frames([{"type": "response.in_progress", "response": response}])

    def encode(self, event: Event) -> bytes | None:
        return self._frames(self._builder.feed(event)) or None

    def close(self, finish: FinishReason | None = None) -> list[bytes]:
        events = self._builder.close(finish)
        response = self._builder.response(self._head, self._builder.final_status())
        events.append({"type": "response.completed", "response": response})
        return [self._frames(events)]

    def fail(self, error: GatewayError) -> bytes:
        self._builder.fail()
        response = self._builder.response(self._head, "failed")
        response["error"] = {"code": error.code or error.type, "message": error.message}
        return self._frames([{"type": "response.failed", "response": response}])


class ResponsesAggregator:
    """Collects Events into one `response` object (non-streaming clients)."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self._builder = builder

    def add(self, event: Event) -> None:
        self._builder.feed(event)

    def body(self, completion_id: str, model: str) -> dict[str, Any]:
        self._builder.close(None)
        return self._builder.response(_head(completion_id, model), self._builder.final_status())


class ResponsesWire:
    """The Responses API answer shape, for the pipeline."""

    endpoint = "responses"
    id_prefix = "resp_"
    include_usage = True

    def __init__(self, echo: dict[str, Any], tool_names: dict[str, ToolName]) -> None:
        self.echo = echo
        self.tool_names = tool_names

    def stream_encoder(
        self, completion_id: str, model: str, prompt_tokens: int = 0
    ) -> ResponsesStreamEncoder:
        return ResponsesStreamEncoder(
            ResponseBuilder(self.echo, self.tool_names), completion_id, model
        )

    def aggregator(self) -> ResponsesAggregator:
        return ResponsesAggregator(ResponseBuilder(self.echo, self.tool_names))
