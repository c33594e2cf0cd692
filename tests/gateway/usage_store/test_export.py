"""The CSV export's lines: the same bytes whichever way the database writes them (PostgreSQL's
COPY, or each line in SQL), streamed, and a reader that stops early leaves the store usable."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.usage_store.queries import ExportQuery
from gateway.usage_store.rows import row_of
from gateway.usage_store.store import UsageStore
from tests.support.usage_records import stream_fields

DAY0 = datetime(2026, 3, 30, tzinfo=UTC).timestamp()


def _rows(n: int) -> list[dict[str, object]]:
    odd = [
        {"route_reason": 'a, "quoted"\nline', "ttft_ms": ""},
        {"model": "ünïcode, model", "cost": "0.000123456789", "latency_ms": "1e-05"},
        {"error_code": "", "status": "429", "provider": "", "thinking": ""},
    ]
    return [
        row_of(
            f"{int((DAY0 + i * 60.5) * 1000)}-{i}",
            stream_fields(i, DAY0 + i * 60.5, **odd[i % len(odd)]),
            frozenset(),
        )
        for i in range(n)
    ]


async def test_the_csv_is_each_records_line_in_time_order(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    made = _rows(3000)  # over two days and a bit: windows of a day on SQLite
    try:
        await store.insert(made)
        for q, chosen in (
            (ExportQuery(), made),
            (ExportQuery(key="key1"), [r for r in made if r["key_id"] == "key1"]),
            (
                ExportQuery(
                    start=datetime.fromtimestamp(DAY0 + 6000, UTC),
                    end=datetime.fromtimestamp(DAY0 + 120_000, UTC),
                    model="model0",
                ),
                [
                    r
                    for r in made
                    if r["model"] == "model0"
                    and r["ts_ms"] >= (DAY0 + 6000) * 1000
                    and r["ts_ms"] < (DAY0 + 120_000) * 1000
                ],
            ),
        ):
            text = b"".join([part async for part in store.export_csv(q)])
            lines = [row[0] async for part in store.export(q, lines=True) for row in part]
            assert lines and text == ("\n".join(lines) + "\n").encode()
            ids = [r[0] async for part in store.export(q) for r in part]
            expected = sorted(chosen, key=lambda r: (r["ts_ms"], r["record_id"]))
            assert ids == [r["record_id"] for r in expected]
    finally:
        await store.aclose()


async def test_a_filter_of_quotes_and_backslashes_is_the_value_itself(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    try:
        odd = "o'brien\\'; --"
        fields = stream_fields(1, DAY0, key_id=odd, model="a\\nb")
        await store.insert([*_rows(5), row_of(f"{int(DAY0 * 1000)}-9", fields, frozenset())])
        for q in (ExportQuery(key=odd), ExportQuery(model="a\\nb")):
            text = b"".join([part async for part in store.export_csv(q)])
            assert text.count(b"\n") == 1 and b"o'brien" in text
        assert b"".join([p async for p in store.export_csv(ExportQuery(key="o"))]) == b""
    finally:
        await store.aclose()


async def test_a_reader_that_stops_early_leaves_the_store_usable(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    try:
        await store.insert(_rows(3000))
        for _ in range(3):  # more times than the reader pool holds connections idle
            async for part in store.export_csv(ExportQuery(), chunk=10):
                assert part
                break
        assert await store.count() == 3000
        text = b"".join([part async for part in store.export_csv(ExportQuery())])
        assert text.count(b"\n") >= 3000
    finally:
        await store.aclose()
