"""A mock Anthropic Messages upstream (aiohttp) for tests: `POST /v1/messages`, `GET /v1/models`.

The `model` of a request picks the answer:
  text       one text block, "Hello from Anthropic"
  think      a thinking block ("Let me think.", signature SIGNATURE), then text "Answer."
  tool       a tool_use block (id "toolu_1", the request's first tool) with input {"q": "x"},
             its JSON in two input_json_delta fragments; stop_reason tool_use
  fail-429   HTTP 429, Retry-After: 3, Anthropic error JSON
  overload   a stream whose text starts, then `event: error` (overloaded_error)
Usage: input_tokens 10, cache_read_input_tokens 2, output_tokens 4. Streams when the body says
`stream: true`, else one `message` object. Requests without `x-api-key: <api_key>` get 401.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

SIGNATURE = "upstream-signature-1"
USAGE = {"input_tokens": 10, "cache_read_input_tokens": 2, "cache_creation_input_tokens": 0}


def _blocks(body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    model = body.get("model")
    if model == "think":
        thinking = {"type": "thinking", "thinking": "Let me think.", "signature": SIGNATURE}
        return [thinking, {"type": "text", "text": "Answer."}], "end_turn"
    if model == "tool":
        name = (body.get("tools") or [{"name": "lookup"}])[0]["name"]
        return [
            {"type": "tool_use", "id": "toolu_1", "name": name, "input": {"q": "x"}}
        ], "tool_use"
    return [{"type": "text", "text": "Hello from Anthropic"}], "end_turn"


def _stream_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    blocks, stop = _blocks(body)
    message = {"id": "msg_up", "type": "message", "role": "assistant", "model": body["model"]}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "content": [], "usage": USAGE}},
        {"type": "ping"},
    ]
    for i, block in enumerate(blocks):
        if block["type"] == "text":
            events.append(
                {
                    "type": "content_block_start",
                    "index": i,
                    "content_block": {"type": "text", "text": ""},
                }
            )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": i,
                    "delta": {"type": "text_delta", "text": block["text"]},
                }
            )
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            events.append({"type": "content_block_start", "index": i, "content_block": start})
            for piece in ("Let me ", "think."):
                delta = {"type": "thinking_delta", "thinking": piece}
                events.append({"type": "content_block_delta", "index": i, "delta": delta})
            delta = {"type": "signature_delta", "signature": SIGNATURE}
            events.append({"type": "content_block_delta", "index": i, "delta": delta})
        else:
            start = {**block, "input": {}}
            events.append({"type": "content_block_start", "index": i, "content_block": start})
            for piece in ('{"q": ', '"x"}'):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append({"type": "content_block_delta", "index": i, "delta": delta})
        events.append({"type": "content_block_stop", "index": i})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 4},
        }
    )
    events.append({"type": "message_stop"})
    return events


@dataclass
class MockAnthropic:
    api_key: str = "anthropic-test-key"
    requests: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    base_url: str = ""  # set by start(): "http://127.0.0.1:<port>"
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "text", "type": "model"}]})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append((dict(request.headers), body))
        if request.headers.get("x-api-key") != self.api_key:
            return _error(401, "authentication_error", "invalid x-api-key")
        if body.get("model") == "fail-429":
            return _error(429, "rate_limit_error", "slow down", {"Retry-After": "3"})
        if not body.get("stream"):
            blocks, stop = _blocks(body)
            message = {"id": "msg_up", "type": "message", "role": "assistant", "content": blocks}
            usage = {**USAGE, "output_tokens": 4}
            return web.json_response({**message, "stop_reason": stop, "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = _stream_events(body)
        if body.get("model") == "overload":
            error = {"type": "overloaded_error", "message": "Overloaded"}
            events = events[:4] + [{"type": "error", "error": error}]
        for event in events:
            await resp.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        return resp


def _error(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=headers)
