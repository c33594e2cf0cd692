"""A live gateway (the real app factory on a free port) in front of the mock upstream, on the
real Redis under a unique key prefix, with one user key created through the real key store."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from multidict import CIMultiDict

from gateway.app import create_app
from gateway.config.settings import Settings
from gateway.resources import PIPELINE, ROUTER
from gateway.server.http_server import GatewayRunner
from testkit.mock_upstream import MockUpstream

REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass
class RawResponse:
    status: int
    headers: CIMultiDict[str]
    body: bytes


@dataclass
class Gateway:
    root: str  # http://127.0.0.1:PORT
    key: str
    mock: MockUpstream
    app: web.Application
    prefix: str
    max_body_bytes: int

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    async def settled(self) -> None:
        """Wait until the gateway has settled every finished request (usage, limits)."""
        await self.app[PIPELINE].drain()

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def sync_client(self, **kw: Any) -> openai.OpenAI:
        kw.setdefault("max_retries", 0)
        return openai.OpenAI(
            base_url=kw.pop("base_url", self.base_url), api_key=kw.pop("api_key", self.key), **kw
        )

    def async_client(self, **kw: Any) -> openai.AsyncOpenAI:
        kw.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(
            base_url=kw.pop("base_url", self.base_url), api_key=kw.pop("api_key", self.key), **kw
        )

    async def post_bytes(
        self,
        body: bytes,
        *,
        path: str = "/v1/chat/completions",
        headers: dict[str, str] | None = None,
    ) -> RawResponse:
        hdrs = self.auth_headers() if headers is None else headers
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{self.root}{path}",
                data=body,
                headers={"Content-Type": "application/json", **hdrs},
            ) as resp,
        ):
            return RawResponse(resp.status, CIMultiDict(resp.headers), await resp.read())

    async def post_raw(
        self, body: dict[str, Any], *, path: str = "/v1/chat/completions"
    ) -> RawResponse:
        return await self.post_bytes(json.dumps(body).encode(), path=path)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PrivateRedis:
    """A redis-server of a test's own (password, port, unix socket, append-only file in `dir`),
    for what the shared one must not see: a restart, an outage, AUTH, databases."""

    dir: Path
    port: int = field(default_factory=closed_port)
    password: str = field(default_factory=lambda: uuid.uuid4().hex)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.dir / "redis.sock"

    def url(self, db: int = 0, password: str | None = None) -> str:
        return f"redis://:{password or self.password}@127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.socket.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--requirepass", self.password,
             "--unixsocket", str(self.socket), "--dir", str(self.dir),
             "--appendonly", "yes", "--save", ""],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(400):
            if self.socket.exists():
                return
            time.sleep(0.025)
        raise RuntimeError("the private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open and nothing is answered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


def gateway_settings(mock: MockUpstream, prefix: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0, "max_body_bytes": 64 * 1024},
        "redis": {"url": REDIS_URL, "embedded": False, "key_prefix": prefix},
        "limits": {"spool_dir": Path(tempfile.gettempdir()) / f"gw-spool-{prefix.strip(':')}"},
        "logging": {"format": "json", "level": "warning"},
        "usage": {"enabled": False},  # the usage store's own tests turn it on
        "use_presets": False,
        "providers": {
            "mock": {
                "kind": "openai",
                "base_url": mock.base_url,
                "first_byte_timeout_s": 5,
                "idle_timeout_s": 5,
                "direct_models": ["*"],  # the mock's model names choose its behaviour
            },
            "impatient": {
                "kind": "openai",
                "base_url": mock.base_url,
                "first_byte_timeout_s": 0.3,
                "idle_timeout_s": 0.3,
                "stream_upstream": True,  # JSON clients too: their first-byte and idle timeouts
                "direct_models": ["*"],
            },
            "hasty": {  # JSON clients' answers come non-streamed, within answer_timeout_s
                "kind": "openai",
                "base_url": mock.base_url,
                "answer_timeout_s": 0.3,
                "direct_models": ["*"],
            },
            "refused": {
                "kind": "openai",
                "base_url": f"http://127.0.0.1:{closed_port()}/v1",
                "connect_timeout_s": 1,
                "direct_models": ["*"],
            },
        },
        "models": {
            "echo-model": {"routes": [{"provider": "mock", "model": "echo"}]},
            "fallback-model": {
                "routes": [
                    {"provider": "mock", "model": "fail-500"},
                    {"provider": "mock", "model": "echo"},
                ]
            },
            "reasoner-model": {"routes": [{"provider": "mock", "model": "echo", "thinking": True}]},
        },
    }
    base.update(overrides)
    return Settings(**base)


async def start_gateway(
    settings: Settings, *, wait_loaded: bool = True, loaded_within_s: float = 600.0
) -> tuple[web.AppRunner, str]:
    """The app listening on a free port. The gateway listens before its local engines are
    loaded; with `wait_loaded` this returns once they are (or failed to load)."""
    app = create_app(settings)
    runner = GatewayRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    if wait_loaded:
        try:
            await engines_loaded(app, loaded_within_s)
        except BaseException:
            await runner.cleanup()
            raise
    return runner, f"http://127.0.0.1:{port}"


async def engines_loaded(app: web.Application, within_s: float) -> None:
    """Until no provider of `app` is loading (`loading()` None: loaded, or failed)."""
    deadline = time.monotonic() + within_s
    providers = app[ROUTER].providers.values()
    while any(getattr(p, "loading", lambda: None)() is not None for p in providers):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the local engine did not load within {within_s} s")
        await asyncio.sleep(0.02)
