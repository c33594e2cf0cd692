"""An OpenAI-compatible upstream that breaks the protocol, for the gateway's fault probes: what a
misconfigured proxy, a crashed server or a buggy vLLM fork sends. (testkit/mock_upstream.py is the
well-behaved upstream with its own failure scenarios: HTTP errors, dropped streams, stalls.)

The behaviour is chosen by the request's model name (streamed when the request says `stream`):
  html        HTTP 200 with an HTML page (a captive portal, a proxy's error page)
  garbled     an answer whose fields have the wrong types (text as a number, tool_calls as a
              string, an index that is not a number)
  overcount   a normal answer whose usage counts no answer could have (10^30, 1e300)
  nochoices   a JSON object that is no answer at all (no choices)
  reset       the connection is dropped before any answer
  retry-inf   HTTP 429 with `Retry-After: inf`
  endless     content frames, one word each, until the client leaves (max_tokens ignored)
`requests` records every request's model, in order.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BEHAVIOURS = ("html", "garbled", "overcount", "nochoices", "reset", "retry-inf", "endless")
_HTML = "<html><head><title>502 Bad Gateway</title></head><body><h1>Oops</h1></body></html>"


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "chatcmpl-broken", "object": "chat.completion.chunk", "choices": [choice]}
    return f"data: {json.dumps({**body, **extra})}\n\n".encode()


def _answer(message: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return {
        "id": "chatcmpl-broken",
        "object": "chat.completion",
        "choices": [choice],
        "usage": usage,
    }


_OVERCOUNT = {"prompt_tokens": 10**30, "completion_tokens": 1e300, "total_tokens": -1}


@dataclass
class BrokenUpstream:
    """Start with `base_url = await broken.start()`; stop with `await broken.stop()`."""

    requests: list[str] = field(default_factory=list)
    base_url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._answer)
        app.router.add_post("/v1/completions", self._answer)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _models(self, request: web.Request) -> web.Response:
        data = [
            {"id": b, "object": "model", "created": 0, "owned_by": "broken"} for b in BEHAVIOURS
        ]
        return web.json_response({"object": "list", "data": data})

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = str(body.get("model"))
        self.requests.append(model)
        stream = bool(body.get("stream"))
        if model == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if model == "retry-inf":
            error = {"error": {"message": "slow down", "type": "rate_limit_error"}}
            return web.json_response(error, status=429, headers={"Retry-After": "inf"})
        if model == "html":
            return web.Response(text=_HTML, content_type="text/html")
        if model == "nochoices":
            return web.json_response({"object": "chat.completion", "note": "nothing here"})
        if not stream:
            if model == "garbled":
                message = {"role": "assistant", "content": 42, "tool_calls": "none"}
                return web.json_response(_answer(message, {"prompt_tokens": "many"}))
            return web.json_response(_answer({"role": "assistant", "content": "hi"}, _OVERCOUNT))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk({"role": "assistant", "content": "hi"}))
        if model == "garbled":
            await resp.write(_chunk({"tool_calls": [{"index": "first", "function": "f"}]}))
            await resp.write(_chunk({"content": 42}))
        elif model == "overcount":
            await resp.write(_chunk({}, "stop"))
            await resp.write(_chunk({}, usage=_OVERCOUNT))
        elif model == "endless":
            while True:
                await resp.write(_chunk({"content": "more "}))
                await asyncio.sleep(0.002)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
