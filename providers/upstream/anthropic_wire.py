"""The Anthropic Messages wire format on the upstream side: ChatRequest -> JSON body, stream
events -> Events. For upstreams that speak Messages (Anthropic, DeepSeek's and TaoToken's
Anthropic-compatible endpoints).

Request (`build_messages_body`): when the client itself spoke Messages, its body travels in
`request.anthropic_body` and is sent as it came (thinking blocks with the upstream's own
signatures, cache_control, server tools: nothing is lost), with only `model`, `max_tokens` (the
granted budget), `stream` and, where the route forces it, `thinking` set by the gateway. Other
requests are translated: system messages -> `system`; tool messages -> `tool_result` blocks of a
user message; assistant tool_calls -> `tool_use` blocks; image_url parts -> image blocks; tools ->
`input_schema`; tool_choice back to auto/any/tool/none; stop -> stop_sequences; thinking on ->
`{type: enabled, budget_tokens}` (half of max_tokens, at least 1024; left off when max_tokens
leaves no room), off -> `{type: disabled}`. Earlier reasoning is not sent (Anthropic accepts
thinking blocks only with its own signatures).

Response (`MessagesDecoder`): text_delta -> TextDelta, thinking_delta -> ReasoningDelta (the
last one of a block held back until the block's signature, which it then carries),
tool_use blocks -> ToolCallDelta (id and name first, then input_json_delta fragments), the
stop_reason -> Finish, usage (input + cache reads + cache writes = prompt tokens) -> Usage.
An `error` event raises.
"""

from __future__ import annotations

import json
from typing import Any

from providers.errors import Overloaded, UpstreamUnavailable
from providers.types import (
    ChatRequest,
    Event,
    Finish,
    FinishReason,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    token_count,
)

_MIN_BUDGET = 1024
_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def build_messages_body(request: ChatRequest, *, stream: bool) -> dict[str, Any]:
    max_tokens = request.sampling.max_tokens or 4096
    if request.anthropic_body is not None:
        body = dict(request.anthropic_body)
        body.update(model=request.model, max_tokens=max_tokens, stream=stream)
        _force_thinking(body, request.thinking, max_tokens)
        return body
    body = {"model": request.model, "max_tokens": max_tokens, "stream": stream}
    system = "\n\n".join(m.text for m in request.messages if m.role in ("system", "developer"))
    if system:
        body["system"] = system
    body["messages"] = _messages(
        [m for m in request.messages if m.role not in ("system", "developer")]
    )
    s = request.sampling
    if s.temperature is not None:
        body["temperature"] = min(s.temperature, 1.0)
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.top_k:
        body["top_k"] = s.top_k
    if s.stop:
        body["stop_sequences"] = list(s.stop)
    if request.tools:
        body["tools"] = [
            {
                "name": t.name,
                **({"description": t.description} if t.description else {}),
                "input_schema": t.parameters or {"type": "object", "properties": {}},
                **({"strict": True} if t.strict else {}),
            }
            for t in request.tools
        ]
        choice = _tool_choice(request.tool_choice)
        if request.parallel_tool_calls is False:
            choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
        if choice is not None:
            body["tool_choice"] = choice
    if request.user:
        body["metadata"] = {"user_id": request.user}
    _force_thinking(body, request.thinking, max_tokens)
    return body


def _force_thinking(body: dict[str, Any], thinking: bool | None, max_tokens: int) -> None:
    """The route's thinking switch, and a budget that fits the granted max_tokens."""
    current = body.get("thinking")
    budget = current.get("budget_tokens") if isinstance(current, dict) else None
    if isinstance(current, dict) and isinstance(budget, int) and budget >= max_tokens:
        fitted = {**current, "budget_tokens": max_tokens - 1}
        body["thinking"] = fitted if max_tokens - 1 >= _MIN_BUDGET else {"type": "disabled"}
    if thinking is None:
        return
    current = body.get("thinking")
    on = isinstance(current, dict) and current.get("type") in ("enabled", "adaptive")
    if thinking and not on:
        budget = max(max_tokens // 2, _MIN_BUDGET)
        if budget < max_tokens:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    elif not thinking:
        body["thinking"] = {"type": "disabled"}


def _tool_choice(choice: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if choice in ("auto", "none"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if isinstance(name, str):
            return {"type": "tool", "name": name}
    return None


def _content(message: Message) -> list[dict[str, Any]]:
    if message.content is None:
        return []
    if isinstance(message.content, str):
        return [{"type": "text", "text": message.content}] if message.content else []
    blocks: list[dict[str, Any]] = []
    for part in message.content:
        if part.get("type") == "text":
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
        elif part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            blocks.append({"type": "image", "source": _image_source(url)})
    return blocks


def _image_source(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        media, data = url[len("data:") :].split(";base64,", 1)
        return {"type": "base64", "media_type": media, "data": data}
    return {"type": "url", "url": url}


def _messages(history: list[Message]) -> list[dict[str, Any]]:
    """Anthropic messages: roles alternate, tool results are user blocks."""
    out: list[dict[str, Any]] = []
    for m in history:
        if m.role == "tool":
            role = "user"
            blocks = [
                {"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": m.text}
            ]
        elif m.role == "assistant":
            role = "assistant"
            blocks = _content(m) + [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)}
                for c in m.tool_calls
            ]
        else:
            role, blocks = "user", _content(m)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return out


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessagesDecoder:
    """Turns one response's stream events (parsed JSON objects) into Events, appended to a list;
    the same interface as `openai_wire.ChunkDecoder`. A whole `message` object (a non-streamed
    answer) is decoded too."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.finished = False
        self._usage: dict[str, int] = {}
        self._stop: str | None = None
        self._stop_sequence: str | None = None
        self._calls: dict[int, int] = {}  # block index -> tool call index
        self._held: str | None = None  # the latest thinking text, waiting for its signature

    def feed(self, event: dict[str, Any], out: list[Event]) -> None:
        kind = event.get("type")
        if kind == "message":
            self._whole(event, out)
        elif kind == "message_start":
            self._count((event.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            self._start(int(event.get("index", 0)), event.get("content_block") or {}, out)
        elif kind == "content_block_delta":
            self._delta(int(event.get("index", 0)), event.get("delta") or {}, out)
        elif kind == "content_block_stop":
            self._release(None, out)
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            self._stop = delta.get("stop_reason") or self._stop
            if isinstance(delta.get("stop_sequence"), str):
                self._stop_sequence = delta["stop_sequence"]
            self._count(event.get("usage"))
        elif kind == "message_stop":
            self.finished = True
        elif kind == "error":
            error = event.get("error") or {}
            message = f"provider {self.provider!r} failed mid-stream: {error.get('message', '')}"
            if error.get("type") == "overloaded_error":
                raise Overloaded(message, provider=self.provider)
            raise UpstreamUnavailable(message, provider=self.provider)

    def end(self, out: list[Event]) -> None:
        self._release(None, out)
        u = self._usage
        cached = u.get("cache_read_input_tokens", 0)
        prompt = u.get("input_tokens", 0) + cached + u.get("cache_creation_input_tokens", 0)
        reason = _FINISH.get(self._stop or "", "stop")
        if reason == "stop" and self._calls:
            reason = "tool_calls"
        out.append(Finish(reason, self._stop_sequence if reason == "stop" else None))
        out.append(Usage(prompt, u.get("output_tokens", 0), cached_prompt_tokens=cached))
        self.finished = True

    def _count(self, usage: Any) -> None:
        """The counts of a usage object (its other fields, e.g. `service_tier`, are skipped);
        a count out of range is a ValueError (`token_count`)."""
        if isinstance(usage, dict):
            for key, value in usage.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    self._usage[key] = token_count(value)

    def _start(self, index: int, block: dict[str, Any], out: list[Event]) -> None:
        kind = block.get("type")
        if kind == "tool_use":
            call = self._calls[index] = len(self._calls)
            out.append(
                ToolCallDelta(call, str(block.get("id") or ""), str(block.get("name") or ""))
            )
            if block.get("input"):
                out.append(ToolCallDelta(call, arguments_fragment=json.dumps(block["input"])))
        elif kind == "text" and block.get("text"):
            out.append(TextDelta(str(block["text"])))
        elif kind == "thinking" and block.get("thinking"):
            self._held = str(block["thinking"])
            self._release(block.get("signature") or None, out)

    def _delta(self, index: int, delta: dict[str, Any], out: list[Event]) -> None:
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            out.append(TextDelta(str(delta["text"])))
        elif kind == "thinking_delta" and delta.get("thinking"):
            self._release(None, out)
            self._held = str(delta["thinking"])
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            self._release(delta["signature"], out)
        elif kind == "input_json_delta" and index in self._calls and delta.get("partial_json"):
            out.append(ToolCallDelta(self._calls[index], arguments_fragment=delta["partial_json"]))

    def _release(self, signature: str | None, out: list[Event]) -> None:
        if self._held is not None:
            out.append(ReasoningDelta(self._held, signature))
            self._held = None

    def _whole(self, message: dict[str, Any], out: list[Event]) -> None:
        for index, block in enumerate(message.get("content") or ()):
            if isinstance(block, dict):
                self._start(index, block, out)
        self._stop = message.get("stop_reason")
        if isinstance(message.get("stop_sequence"), str):
            self._stop_sequence = message["stop_sequence"]
        self._count(message.get("usage"))
        self.finished = True
