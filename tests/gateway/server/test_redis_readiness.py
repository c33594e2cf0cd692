"""Start-up against a Redis that is not ready: one still loading its data (LOADING) is waited
for up to `redis.start_timeout_s`; an embedded redis-server that exits is noticed at once, and
the error says why."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import hiredis
import pytest

from gateway.config.process import RedisSettings
from gateway.server.redis_server import RedisNotReady, open_redis
from testkit.gateway_app import closed_port


@asynccontextmanager
async def loading_redis(
    loading_pings: int, first_answer_after_s: float = 0.0
) -> AsyncIterator[tuple[int, list[int]]]:
    """A stand-in Redis on a free port that answers its first `loading_pings` PINGs with
    LOADING, then PONG (and OK to anything else), the very first answer only after
    `first_answer_after_s`; yields (port, [PINGs seen])."""
    pings = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = hiredis.Reader()
        while data := await reader.read(4096):
            parser.feed(data)
            while (command := parser.gets()) is not False:
                if command[0].upper() == b"PING":
                    pings[0] += 1
                    if pings[0] == 1:
                        await asyncio.sleep(first_answer_after_s)
                    loading = pings[0] <= loading_pings
                    writer.write(b"-LOADING Redis is loading\r\n" if loading else b"+PONG\r\n")
                else:
                    writer.write(b"+OK\r\n")
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], pings
    finally:
        server.close()
        await server.wait_closed()


async def test_a_configured_redis_that_is_loading_is_waited_for(tmp_path: Path) -> None:
    async with loading_redis(loading_pings=5) as (port, pings):
        settings = RedisSettings(
            url=f"redis://127.0.0.1:{port}/0", embedded=False, data_dir=tmp_path
        )
        async with open_redis(settings) as redis:
            assert await redis.ping()
        assert pings[0] >= 6
    assert not (tmp_path / "redis.sock").exists()  # no embedded server was started instead


async def test_a_configured_redis_slow_to_answer_is_waited_for_not_replaced(
    tmp_path: Path,
) -> None:
    # Its first PING answered after the start-up probe gave up on it: a busy server, not a down
    # one. Even with the embedded fallback on, no embedded server is started beside it.
    async with loading_redis(loading_pings=0, first_answer_after_s=0.5) as (port, pings):
        settings = RedisSettings(
            url=f"redis://127.0.0.1:{port}/0", embedded=True, data_dir=tmp_path, timeout_s=0.2
        )
        async with open_redis(settings) as redis:
            assert await redis.ping()
        assert pings[0] >= 2
    assert not (tmp_path / "redis.sock").exists()


async def test_a_redis_still_loading_past_the_deadline_is_a_clear_error(tmp_path: Path) -> None:
    async with loading_redis(loading_pings=10**9) as (port, _):
        settings = RedisSettings(
            url=f"redis://127.0.0.1:{port}/0", embedded=False, start_timeout_s=0.3
        )
        with pytest.raises(RedisNotReady, match="still loading its data after 0.3s"):
            async with open_redis(settings):
                pass


async def test_an_embedded_server_that_exits_is_noticed_and_explained(tmp_path: Path) -> None:
    data_dir = tmp_path / "redis"
    (data_dir / "appendonlydir").mkdir(parents=True)
    manifest = data_dir / "appendonlydir" / "appendonly.aof.manifest"
    manifest.write_text("this is not a manifest\n")  # redis-server refuses to start on it
    settings = RedisSettings(
        url=f"redis://127.0.0.1:{closed_port()}/0", embedded=True, data_dir=data_dir
    )
    with pytest.raises(RedisNotReady, match=r"exited with status \d+.*log ends:.*") as err:
        async with open_redis(settings):
            pass
    assert "manifest" in str(err.value).lower()
