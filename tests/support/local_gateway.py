"""Tiny checkpoints for end-to-end tests, and a live gateway serving them from the local engine.

`tiny_checkpoint`: the random-weight "tiny" demo preset (fp32), built once per session.
`scripted_checkpoint`: the same model rewired (testkit/scripted_model.py) so greedy decoding
after `</think>` (the end of every non-thinking prompt) spells a V3.1 tool call.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from redis.asyncio import Redis

from backend.text.tokenizer import Tokenizer
from gateway.config.settings import Settings
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from gateway.resources import ROUTER
from providers.local.provider import LocalProvider
from testkit.gateway_app import REDIS_URL, start_gateway
from testkit.scripted_model import build_tiny_checkpoint, rewire_checkpoint, tool_call_text

TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = '{"city":"Paris"}'
TOOL_CALL_TEXT = tool_call_text(TOOL_NAME, TOOL_ARGUMENTS)


def scripted_chain(tokenizer: Tokenizer) -> list[int]:
    """`</think>`, the tool call's tokens, then EOS: each token predicts the next."""
    return [tokenizer.special.think_end, *tokenizer.encode(TOOL_CALL_TEXT), tokenizer.special.eos]


def build_scripted_checkpoint(tiny_dir: Path, out_dir: Path) -> Path:
    """A copy of the tiny checkpoint whose greedy output after `</think>` is TOOL_CALL_TEXT."""
    return rewire_checkpoint(tiny_dir, out_dir, [scripted_chain(Tokenizer.from_dir(tiny_dir))])


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("e2e-tiny"))


@pytest.fixture(scope="session")
def scripted_checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    return build_scripted_checkpoint(tiny_checkpoint, tmp_path_factory.mktemp("e2e-scripted"))


def local_settings(prefix: str, model_path: Path, **engine: Any) -> Settings:
    """One local provider on `model_path` behind deepseek-chat (thinking off),
    deepseek-reasoner (on) and deepseek-v3.1 (the client's choice)."""
    route = {"provider": "local", "model": "deepseek-v3.1"}
    return Settings(
        server={"host": "127.0.0.1", "port": 0, "keepalive_s": 5},
        redis={"url": REDIS_URL, "embedded": False, "key_prefix": prefix},
        logging={"format": "json", "level": "warning"},
        usage={"enabled": False},
        use_presets=False,
        engine={
            "model_path": model_path,
            "dtype": "float32",
            "block_size": 16,
            "cache_memory_mb": 2,
            "max_num_seqs": 32,
            "max_batch_tokens": 1024,
            "num_threads": 1,
            **engine,
        },
        providers={"local": {"kind": "local"}},
        models={
            "deepseek-v3.1": {"routes": [route]},
            "deepseek-chat": {"routes": [{**route, "thinking": False}]},
            "deepseek-reasoner": {"routes": [{**route, "thinking": True}]},
        },
    )


@dataclass
class LocalGateway:
    root: str
    key: str
    app: web.Application
    prefix: str  # the gateway's Redis key prefix

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def provider(self) -> LocalProvider:
        provider = self.app[ROUTER].providers["local"].local  # the loaded engine's
        assert isinstance(provider, LocalProvider)
        return provider


@asynccontextmanager
async def open_local_gateway(model_path: Path, **engine: Any) -> AsyncIterator[LocalGateway]:
    """A started gateway with one user key, on a unique Redis prefix removed afterwards."""
    prefix = f"test:{uuid.uuid4().hex}:"
    runner, root = await start_gateway(local_settings(prefix, model_path, **engine))
    redis = Redis.from_url(REDIS_URL)
    try:
        secret, _ = await KeyStore(redis, prefix=prefix).create(KeyCreate(name="e2e"))
        yield LocalGateway(root, secret, runner.app, prefix)
    finally:
        await runner.cleanup()
        keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def local_gateway(tiny_checkpoint: Path) -> AsyncIterator[LocalGateway]:
    """Shared by a module's tests (their loop scope must be "module" too)."""
    async with open_local_gateway(tiny_checkpoint) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scripted_gateway(scripted_checkpoint: Path) -> AsyncIterator[LocalGateway]:
    async with open_local_gateway(scripted_checkpoint) as gateway:
        yield gateway
