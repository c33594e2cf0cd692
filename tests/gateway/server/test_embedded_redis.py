from pathlib import Path

import pytest

from gateway.config.settings import RedisSettings
from gateway.server.redis_server import open_redis
from testkit.gateway_app import closed_port


async def test_embedded_redis_starts_persists_and_stops(tmp_path: Path) -> None:
    settings = RedisSettings(
        url=f"redis://127.0.0.1:{closed_port()}/0", embedded=True, data_dir=tmp_path / "redis"
    )
    async with open_redis(settings) as redis:
        await redis.set("gw:test", "kept")
    assert (tmp_path / "redis" / "appendonlydir").is_dir()
    async with open_redis(settings) as redis:  # a restart loses nothing
        assert await redis.get("gw:test") == b"kept"


async def test_unreachable_redis_without_embedded_fails_clearly(tmp_path: Path) -> None:
    settings = RedisSettings(url=f"redis://127.0.0.1:{closed_port()}/0", embedded=False)
    with pytest.raises(RuntimeError, match="unreachable"):
        async with open_redis(settings):
            pass
