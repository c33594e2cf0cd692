"""A mock OpenAI-compatible upstream (aiohttp) for tests and benchmarks.

One server serves many scenarios: the behaviour of each request is chosen by its `model` name,
`<scenario>[-<option>[-<value>]]...`, e.g. "echo", "echo-chunks-100", "slow-delay-0.2",
"fail-429", "die-midstream-after-2", "reasoning-content-crlf".

Scenarios (streaming when the request says `stream: true`, one JSON body otherwise; without
streaming, die-midstream drops the connection, stall hangs and error-midstream answers 500):
  echo               the last user message's words, one word per chunk; honours max_tokens
                     (by words; finish "length") and stop strings
  tools              `calls` tool calls (default 1) to the request's tools, arguments
                     `{"query": <last user text>}` streamed in fragments; finish "tool_calls"
  reasoning-content  reasoning in `delta.reasoning_content`, then the echo answer
  reasoning          reasoning in `delta.reasoning` (newer vLLM), then the echo answer
  think-inline       `<think>reasoning</think>answer` in content, cut into 4-character chunks
  fail-<status>      that HTTP status with OpenAI error JSON (Retry-After: 7 on 429 and 503)
  slow               echo after `delay` seconds (default 1.0) before the response headers
  keepalive          3 `: keep-alive` comments and blank lines `gap` seconds apart (default
                     0.01) before the data, and one after every data chunk
  die-midstream      `after` content chunks (default 3), then the connection is dropped
  stall              `after` content chunks (default 1), then silence until the client leaves
                     (with `comments`: a `: keep-alive` comment every `gap` s, default 0.05)
  error-midstream    `after` content chunks (default 2), then `data: {"error": ...}`
  hang               never answers (not even headers) until the client leaves
Options for every scenario:
  chunks-N   the answer is exactly N words (the user's words cycled), one chunk each
  delay-S    seconds before the response headers;  gap-S  seconds between chunks
  cached-N   usage.prompt_tokens_details.cached_tokens = N
  hit-N      DeepSeek usage: prompt_cache_hit_tokens = N, prompt_cache_miss_tokens = rest
  crlf       `\\r\\n` line endings;  nousage  never report usage;  nodone  no `data: [DONE]`
  json       answer a JSON body even to a streaming request
Usage: prompt_tokens = `prompt_tokens(body)` (words of every message + 1 per message);
completion_tokens = words emitted (reasoning included); reasoning_tokens = reasoning words.

`MockUpstream` records every request and every client that left a stream early.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from testkit.mock_scenarios import SCENARIOS, Options, Plan, make_plan, message_of, parse_model


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None
    peer: Any  # the client's (host, port): equal for requests on one kept-alive connection


@dataclass
class MockUpstream:
    """Start with `base_url = await mock.start()`; stop with `await mock.stop()`.

    `api_key`: when set, requests without `Authorization: Bearer <api_key>` get 401.
    `models_status`: the status GET /v1/models answers with (tests flip it to fail health).
    """

    api_key: str | None = None
    models_status: int = 200
    requests: list[RecordedRequest] = field(default_factory=list)
    disconnects: list[RecordedRequest] = field(default_factory=list)
    client_disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    request_arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set on every request
    streams_completed: int = 0
    base_url: str = ""  # set by start(): "http://127.0.0.1:<port>/v1"
    _runner: web.AppRunner | None = None
    _counter: int = 0

    async def start(self, port: int = 0) -> str:
        """Serve on `port` (0: a free one); a stopped mock restarts on its old port."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._chat)
        app.router.add_post("/beta/completions", self._chat)  # DeepSeek's fill in the middle
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=0.2
        )
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart on its port
        sock.bind(("127.0.0.1", port))
        port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_disconnect(self, within_s: float = 5.0) -> RecordedRequest:
        """The first recorded early disconnect, waiting up to `within_s` seconds for it."""
        async with asyncio.timeout(within_s):
            await self.client_disconnected.wait()
        return self.disconnects[0]

    def _record(self, request: web.Request, body: Any) -> RecordedRequest:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        recorded = RecordedRequest(request.method, request.path, dict(request.headers), body, peer)
        self.requests.append(recorded)
        self.request_arrived.set()
        return recorded

    def _denied(self, request: web.Request) -> bool:
        return self.api_key is not None and (
            request.headers.get("Authorization") != f"Bearer {self.api_key}"
        )

    async def _models(self, request: web.Request) -> web.Response:
        self._record(request, None)
        if self._denied(request):
            return _error(401, "Incorrect API key provided")
        if self.models_status != 200:
            return _error(self.models_status, "models unavailable")
        data = [{"id": s, "object": "model", "created": 0, "owned_by": "mock"} for s in SCENARIOS]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        recorded = self._record(request, body)
        if self._denied(request):
            return _error(401, "Incorrect API key provided")
        opts = parse_model(str(body.get("model", "")))
        if opts is None:
            return _error(404, f"The model `{body.get('model')}` does not exist")
        self._counter += 1
        try:
            if opts.delay:
                await asyncio.sleep(opts.delay)
            if opts.scenario == "hang":
                await asyncio.Event().wait()
            if opts.scenario == "fail":
                return _error(opts.status, f"mock failure {opts.status}")
            plan = make_plan(body, opts)
            legacy = request.path.endswith("/completions") and "messages" not in body
            if body.get("stream") and "json" not in opts.flags:
                return await self._stream(request, body, opts, plan, legacy)
            if opts.scenario == "error-midstream":
                return _error(500, "mock midstream failure")
            if opts.scenario in ("die-midstream", "stall"):
                return await self._break_stream(request, web.StreamResponse(), opts, "\n")
            return web.json_response(self._full(body, plan, legacy))
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnects.append(recorded)
            self.client_disconnected.set()
            raise

    def _full(self, body: dict[str, Any], plan: Plan, legacy: bool) -> dict[str, Any]:
        message = message_of(plan)
        choice: dict[str, Any] = {"index": 0, "finish_reason": plan.finish_reason}
        if legacy:
            choice["text"] = message["content"] or ""
        else:
            choice["message"] = message
        return {
            "id": f"chatcmpl-mock{self._counter}",
            "object": "text_completion" if legacy else "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [choice],
            "usage": plan.usage,
        }

    async def _stream(
        self, request: web.Request, body: dict[str, Any], opts: Options, plan: Plan, legacy: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        eol = "\r\n" if "crlf" in opts.flags else "\n"
        envelope = {
            "id": f"chatcmpl-mock{self._counter}",
            "object": "text_completion" if legacy else "chat.completion.chunk",
            "created": int(time.time()),
            "model": body["model"],
        }
        with_logprobs = bool(body.get("logprobs"))

        async def frame(choices: list[dict[str, Any]], **extra: Any) -> None:
            payload = json.dumps({**envelope, "choices": choices, **extra})
            await resp.write(f"data: {payload}{eol}{eol}".encode())

        def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            if legacy:
                return {"index": 0, "text": delta.get("content", ""), "finish_reason": finish}
            out: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            if with_logprobs and "content" in delta:
                token = delta["content"]
                entry = {"token": token, "logprob": -0.5, "bytes": list(token.encode())}
                out["logprobs"] = {"content": [{**entry, "top_logprobs": []}]}
            return out

        keepalive = f": keep-alive{eol}{eol}{eol}".encode()
        if opts.scenario == "keepalive":
            for _ in range(3):
                await resp.write(keepalive)
                await asyncio.sleep(opts.gap or 0.01)
        if not legacy:
            await frame([choice({"role": "assistant", "content": ""})])
        after = opts.after
        if after is None:
            after = {"die-midstream": 3, "stall": 1, "error-midstream": 2}.get(opts.scenario)
        for i, delta in enumerate(plan.deltas):
            if i == after:
                return await self._break_stream(request, resp, opts, eol)
            await frame([choice(delta)])
            if opts.scenario == "keepalive":
                await resp.write(keepalive)
            if opts.gap:
                await asyncio.sleep(opts.gap)
        if after is not None:
            return await self._break_stream(request, resp, opts, eol)
        await frame([choice({}, plan.finish_reason)])
        stream_options = body.get("stream_options") or {}
        if stream_options.get("include_usage") and "nousage" not in opts.flags:
            await frame([], usage=plan.usage)
        if "nodone" not in opts.flags:
            await resp.write(f"data: [DONE]{eol}{eol}".encode())
        await resp.write_eof()
        self.streams_completed += 1
        return resp

    async def _break_stream(
        self, request: web.Request, resp: web.StreamResponse, opts: Options, eol: str
    ) -> web.StreamResponse:
        """Ends a stream the broken way its scenario names."""
        if opts.scenario == "error-midstream":
            error = {"error": {"message": "mock midstream failure", "type": "server_error"}}
            await resp.write(f"data: {json.dumps(error)}{eol}{eol}".encode())
            await resp.write_eof()
            return resp
        if opts.scenario == "die-midstream":
            assert request.transport is not None
            request.transport.abort()
            return resp
        if "comments" in opts.flags:  # stall that looks alive: comments, never data
            while True:
                await resp.write(f": keep-alive{eol}{eol}".encode())
                await asyncio.sleep(opts.gap or 0.05)
        await asyncio.Event().wait()  # stall: until the client leaves (cancels this handler)
        return resp


def _error(status: int, message: str) -> web.Response:
    headers = {"Retry-After": "7"} if status in (429, 503) else {}
    kind = "server_error" if status >= 500 else "invalid_request_error"
    error = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.json_response(error, status=status, headers=headers)
