"""The console's shared summaries: one store query per distinct view within the time-to-live,
a fresh one after it, distinct views apart, and the oldest answers dropped past the bound."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.admin.console.summaries import Summaries
from gateway.usage_store.queries import SummaryQuery
from gateway.usage_store.store import UsageStore
from gateway.usage_store.summary_sql import Only


class Counted(UsageStore):
    calls = 0

    async def summary(self, q: SummaryQuery, only: Only | None = None) -> list[dict[str, Any]]:
        self.calls += 1
        return await super().summary(q, only)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Counted]:
    opened = await UsageStore.open(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    counted = Counted(opened._writer, opened._reader, opened._batches)
    yield counted
    await opened.aclose()


async def test_answers_are_shared_then_refreshed(store: Counted) -> None:
    shared = Summaries(ttl_s=60)
    by_model = SummaryQuery(group_by="model")
    assert await shared.summary(store, by_model) == []
    await shared.summary(store, SummaryQuery(group_by="model"))
    assert store.calls == 1
    await shared.summary(store, SummaryQuery(group_by="key"))
    assert store.calls == 2
    other_process = Summaries(ttl_s=60)
    assert await other_process.summary(store, by_model) == [] and store.calls == 3
    # the same query over other groups is another view
    await shared.summary(store, by_model, only={"model": ["a", "b"]})
    await shared.summary(store, by_model, only={"model": ["b", "a"]})
    assert store.calls == 4
    await shared.summary(store, by_model, only={"model": ["a"]})
    assert store.calls == 5


async def test_the_oldest_answers_go_past_the_bound(store: Counted) -> None:
    shared = Summaries(ttl_s=60, size=2)
    first, second, third = (SummaryQuery(group_by=g) for g in ("key", "model", "provider"))
    for q in (first, second, third):
        await shared.summary(store, q)
    await shared.summary(store, third)
    await shared.summary(store, second)
    assert store.calls == 3
    await shared.summary(store, first)  # dropped: asked of the store again
    assert store.calls == 4
