"""The real gateway (GatewayRunner, real Redis under a unique prefix) in front of the mock
upstream, on an event loop in a thread of its own: for synchronous drivers such as hypothesis
and schemathesis, which call it over 127.0.0.1.

Only configured model ids route (no direct `provider/model`), and the only upstream is the
mock's `echo`, so no answer has a reason to be a 5xx: every one the fuzzers see is a bug."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from typing import Any

import redis
from multidict import CIMultiDict
from redis.asyncio import Redis as AsyncRedis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from gateway.wire.messages_errors import is_messages_path
from testkit.gateway_app import REDIS_URL, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream
from testkit.rawhttp import RawAnswer, parse_answer

ADMIN_KEY = "admin-" + uuid.uuid4().hex


class ThreadedGateway:
    def __init__(self, **overrides: Any) -> None:
        """`overrides`: settings sections, e.g. `usage={...}`."""
        self._overrides = overrides
        self.prefix = f"test:{uuid.uuid4().hex}:"
        self.root = ""
        self.key = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._stop: Any = None

    def __enter__(self) -> ThreadedGateway:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=60)
        return self

    def __exit__(self, *_: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
            client = redis.Redis.from_url(REDIS_URL)
            keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()

    async def _start(self) -> None:
        mock = MockUpstream()
        await mock.start()
        settings = gateway_settings(mock, self.prefix, admin={"api_key": ADMIN_KEY})
        providers = {"mock": settings.providers["mock"].model_copy(update={"direct_models": ()})}
        settings = gateway_settings(
            mock, self.prefix, admin={"api_key": ADMIN_KEY}, providers=providers, **self._overrides
        )
        runner, self.root = await start_gateway(settings)
        client = AsyncRedis.from_url(REDIS_URL)
        self.key, _ = await KeyStore(client, prefix=self.prefix).create(KeyCreate(name="fuzz"))
        await client.aclose()

        async def stop() -> None:
            await runner.cleanup()
            await mock.stop()

        self._stop = stop

    def send(self, raw: bytes) -> RawAnswer:
        """One raw request on a fresh connection; the answer read until the server closes."""
        port = int(self.root.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(raw)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return parse_answer(b"".join(chunks))


def assert_api_answer(
    status: int, raw_headers: Any, body: bytes, where: str = "", path: str = ""
) -> None:
    """What every answer must be: no 5xx, an `x-request-id`, and an error in the shape of the
    protocol `path` belongs to: Anthropic's on the Messages API, else OpenAI's (and OpenAI's for
    what the HTTP parser refused before the path was read). `raw_headers`: name -> value, or
    name -> list of values (schemathesis' responses)."""
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in raw_headers.items():
        for one in value if isinstance(value, list) else [value]:
            headers.add(name, one)
    assert status < 500, (where, status, body[:500])
    assert headers.get("x-request-id"), (where, status, dict(headers))
    if status < 400:
        return
    assert headers.get("Content-Type", "").startswith("application/json"), (where, status)
    answer = json.loads(body)
    error = answer["error"]
    assert isinstance(error["message"], str) and error["message"], (where, body)
    assert isinstance(error["type"], str), (where, body)
    unparsed = error.get("code") == "malformed_http_request"
    if is_messages_path(path.split("?", 1)[0]) and not unparsed:
        assert answer.get("type") == "error" and set(error) == {"type", "message"}, (where, body)
        assert headers.get("request-id") == headers["x-request-id"], (where, dict(headers))
    else:
        assert {"param", "code"} <= set(error), (where, body)
