"""`python -m gateway usage-store summary|records|export`, in-process, on a SQLite store."""

from __future__ import annotations

import asyncio
import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from gateway.cli import main
from gateway.usage_store.rows import row_of
from gateway.usage_store.store import UsageStore
from tests.support.usage_records import stream_fields

T0 = 1_775_000_000.0


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}"
    monkeypatch.delenv("GATEWAY_CONFIG", raising=False)
    monkeypatch.setenv("GATEWAY_USAGE__ENABLED", "true")
    monkeypatch.setenv("GATEWAY_USAGE__URL", url)

    async def fill() -> None:
        store = await UsageStore.open(url)
        rows = [row_of(f"{i + 1}-0", stream_fields(i, T0 + i), frozenset()) for i in range(30)]
        await store.insert(rows)
        await store.aclose()

    asyncio.run(fill())
    logging_config = structlog.get_config()
    yield url
    structlog.configure(**logging_config)


def test_summary_records_and_export(
    url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["usage-store", "summary", "--group-by", "key", "--no-latency"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [(r["key"], r["requests"]) for r in summary["data"]] == [
        ("key0", 10),
        ("key1", 10),
        ("key2", 10),
    ]
    assert main(["usage-store", "records", "--key", "key1", "--limit", "4"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [r["request_id"] for r in page["data"]] == ["req-28", "req-25", "req-22", "req-19"]
    assert page["next_cursor"]
    out = tmp_path / "usage.csv"
    assert main(["usage-store", "export", "--model", "model0", "--output", str(out)]) == 0
    with open(out, newline="") as fh:
        lines = list(csv.DictReader(fh))
    assert [line["request_id"] for line in lines] == [f"req-{i}" for i in range(0, 30, 2)]


def test_bad_input_is_exit_status_2(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage-store", "summary", "--group-by", "colour"]) == 2
    assert "group-by" in capsys.readouterr().err
    assert main(["usage-store", "records", "--limit", "0"]) == 2
