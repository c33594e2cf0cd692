"""The usage store is on by default wherever keys are: a keyed gateway with no `[usage]` of its
own stores its records in a SQLite file under `.data/`; without keys it is off, and asking for it
without keys is a settings error."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from gateway.config.settings import Settings
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from gateway.usage_store.store import UsageStore
from testkit.gateway_app import REDIS_URL, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream


@pytest.fixture
def defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The settings' own defaults (not the suite's), run from an empty directory."""
    monkeypatch.delenv("GATEWAY_USAGE__ENABLED", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_on_with_keys_off_without(defaults: Path) -> None:
    keyed = Settings(use_presets=False)
    assert keyed.auth.enabled and keyed.usage.enabled
    assert keyed.usage.url == "sqlite+aiosqlite:///.data/usage.db"
    Settings(use_presets=False, auth={"enabled": False})  # the default store simply stays off
    with pytest.raises(ValidationError, match="usage.enabled needs auth.enabled"):
        Settings(use_presets=False, auth={"enabled": False}, usage={"enabled": True})


async def test_a_keyed_gateway_stores_usage_under_dot_data_by_default(
    defaults: Path, mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    settings = gateway_settings(mock_upstream, redis_prefix, usage={"block_ms": 50})
    assert settings.usage.enabled
    runner, root = await start_gateway(settings)
    try:
        redis = Redis.from_url(REDIS_URL)
        try:
            secret, _ = await KeyStore(redis, prefix=redis_prefix).create(KeyCreate(name="d"))
        finally:
            await redis.aclose()
        client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=secret, max_retries=0)
        await client.chat.completions.create(
            model="echo-model", messages=[{"role": "user", "content": "hello"}]
        )
        await client.close()
        database = defaults / ".data" / "usage.db"
        store = await UsageStore.open(f"sqlite+aiosqlite:///{database}")
        try:
            deadline = time.monotonic() + 20
            while await store.count() < 1:
                assert time.monotonic() < deadline, "the record was never stored"
                await asyncio.sleep(0.05)
        finally:
            await store.aclose()
    finally:
        await runner.cleanup()
