"""The usage store in a serving process: opened with the app, consumer and retention in the
background (off the request path), closed after the app's settlements have drained."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import structlog
from redis.asyncio import Redis

from gateway.config.usage import UsageSettings
from gateway.usage_store.consumer import UsageConsumer
from gateway.usage_store.store import UsageStore

log = structlog.get_logger("gateway.usage_store")


async def keep_retention(store: UsageStore, settings: UsageSettings) -> None:
    """Delete what is past retention now and every `retention_interval_s`; failures wait
    for the next round."""
    while True:
        try:
            deleted = await store.purge(
                time.time(), settings.retention_days, settings.rollup_retention_days
            )
            if any(deleted.values()):
                log.info("usage_retention", **deleted)
        except Exception as exc:  # the database down: next round
            log.warning("usage_retention_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        await asyncio.sleep(settings.retention_interval_s)


@contextlib.asynccontextmanager
async def open_usage_store(
    redis: Redis, settings: UsageSettings, *, stream: str, local_providers: frozenset[str]
) -> AsyncIterator[UsageStore]:
    """Open the store (migrating it) and run a consumer of `stream` and retention until
    exit; on exit the consumer finishes its batch (what it has not stored stays pending in
    the stream, for the next start or another node)."""
    store = await UsageStore.open(settings.url)
    consumer = UsageConsumer(
        redis, store, stream=stream, settings=settings, local_providers=local_providers
    )
    consuming = asyncio.create_task(consumer.run(), name="usage-consumer")
    retention = asyncio.create_task(keep_retention(store, settings), name="usage-retention")
    try:
        yield store
    finally:
        retention.cancel()
        consumer.stop()
        try:
            await asyncio.wait_for(asyncio.shield(consuming), settings.block_ms / 1000 + 10)
        except TimeoutError:
            consuming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consuming
        with contextlib.suppress(asyncio.CancelledError):
            await retention
        await store.aclose()
