"""A `RedisAccessControl` for the limiter tests: its own key prefix on the shared Redis, a small
usage stream, a spool in the test's directory and the test's clock; its keys deleted after."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from redis.asyncio import Redis

from gateway.keys.redis_access import RedisAccessControl
from tests.support.clock import Clock


@contextlib.asynccontextmanager
async def limiter_access(
    redis: Redis, clock: Clock, tmp_path: Path, **options: object
) -> AsyncIterator[RedisAccessControl]:
    """`options`: further `RedisAccessControl` arguments (pricing, say)."""
    prefix = f"test:{uuid.uuid4().hex}:"
    access = RedisAccessControl(
        redis,
        prefix=prefix,
        usage_stream_maxlen=3,
        slot_lease_s=300,
        spool_dir=tmp_path / "spool",
        clock=clock,
        **options,  # type: ignore[arg-type]
    )
    try:
        yield access
    finally:
        await access.aclose()
        keys = [key async for key in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)
