"""A listing of the requests of one status other than 200 reads the index of those (refusals
and failures, a few in a hundred), newest first, and finds what a scan finds."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from sqlalchemy.engine import make_url

from gateway.usage_store.queries import RecordsQuery
from gateway.usage_store.rows import row_of
from gateway.usage_store.store import UsageStore
from tests.support.usage_records import stream_fields

DAY0 = datetime(2026, 3, 30, tzinfo=UTC).timestamp()


async def test_a_status_listing_finds_its_records_newest_first(store_url: str) -> None:
    made = [
        row_of(
            f"{int((DAY0 + i) * 1000)}-{i}",
            stream_fields(i, DAY0 + i, status=(502 if i % 7 == 0 else 429 if i % 11 == 0 else 200)),
            frozenset(),
        )
        for i in range(700)
    ]
    store = await UsageStore.open(store_url)
    try:
        await store.insert(made)
        for status, model in ((502, None), (429, "model1"), (200, "model0")):
            q = RecordsQuery(status=status, model=model, limit=1000)
            found, _ = await store.records(q)
            expected = [
                r["record_id"]
                for r in reversed(made)
                if r["status"] == status and (model is None or r["model"] == model)
            ]
            assert [r["record_id"] for r in found] == expected and expected
        if store.dialect == "sqlite":
            path = make_url(store_url).database
            assert path is not None
            with sqlite3.connect(path) as conn:
                plan = conn.execute(
                    "EXPLAIN QUERY PLAN SELECT * FROM usage_records WHERE status = 502 "
                    "AND status != 200 ORDER BY ts_ms DESC LIMIT 50"
                ).fetchall()
            assert "usage_records_not_ok" in str(plan)
    finally:
        await store.aclose()
