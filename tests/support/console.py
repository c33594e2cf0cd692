"""A keyed gateway with the usage store and the admin console on, and an HTTP client that signs
in to the console as a browser would (cookie jar, CSRF token read from the page)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from testkit.gateway_app import REDIS_URL, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream

ADMIN_KEY = "admin-console-secret"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class ConsoleGateway:
    root: str
    runner: web.AppRunner
    user_key: str
    user_key_id: str

    def client(self) -> ConsoleClient:
        return ConsoleClient(self.root)


class ConsoleClient:
    """One browser: its cookies, and the CSRF token of the last page it read."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        self.csrf = ""

    async def close(self) -> None:
        await self.session.close()

    async def request(
        self, method: str, path: str, **kw: Any
    ) -> tuple[int, dict[str, str], str, aiohttp.ClientResponse]:
        kw.setdefault("allow_redirects", False)
        async with self.session.request(method, f"{self.root}{path}", **kw) as resp:
            text = await resp.text()
            if found := CSRF.search(text):
                self.csrf = found.group(1)
            return resp.status, dict(resp.headers), text, resp

    async def login(self, key: str = ADMIN_KEY) -> int:
        status, _, _, _ = await self.request("POST", "/admin/ui/login", data={"admin_key": key})
        if status == 303:
            await self.request("GET", "/admin/ui/keys")  # reads a CSRF token
        return status

    async def post_and_follow(
        self, path: str, data: dict[str, str]
    ) -> tuple[str, int, dict[str, str], str]:
        """POST a change as a browser does: it must answer 303 (post/redirect/get); the GET
        page it sends to is read. (location, that page's status, headers, text)"""
        status, headers, _ = await self.post(path, data)
        assert status == 303, f"POST {path} answered {status}, not 303"
        location = headers["Location"]
        assert headers["Cache-Control"] == "no-store"
        got, got_headers, text, _ = await self.request("GET", location)
        return location, got, got_headers, text

    async def post(self, path: str, data: dict[str, str]) -> tuple[int, dict[str, str], str]:
        status, headers, text, _ = await self.request(
            "POST", path, data={"csrf": self.csrf, **data}
        )
        return status, headers, text


@pytest.fixture
async def console_gateway(
    mock_upstream: MockUpstream, redis_prefix: str, tmp_path: Path
) -> AsyncIterator[ConsoleGateway]:
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        admin={"api_key": ADMIN_KEY, "login_attempts_per_minute": 5},
        usage={
            "enabled": True,
            "url": f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}",
            "block_ms": 50,
            "prices": {"echo-model": {"input": 2.0, "cached_input": 0.5, "output": 8.0}},
        },
    )
    runner, root = await start_gateway(settings)
    redis = Redis.from_url(REDIS_URL)
    secret, record = await KeyStore(redis, prefix=redis_prefix).create(KeyCreate(name="user"))
    await redis.aclose()
    try:
        yield ConsoleGateway(root, runner, secret, record.id)
    finally:
        await runner.cleanup()


@pytest.fixture
async def console(console_gateway: ConsoleGateway) -> AsyncIterator[ConsoleClient]:
    """A client signed in to the console."""
    client = console_gateway.client()
    assert await client.login() == 303
    yield client
    await client.close()
