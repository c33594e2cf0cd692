"""Rows and rollup arithmetic: stream entries as the Redis client returns them make the rows
their decoded fields make, the daily rollup folded from the hourly one equals the daily rollup
of the rows themselves, and the two-quantile pass reads what two single quantiles read."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from gateway.usage_store.buckets import DAY_S, HOUR_S, MONTH, bucket_start, next_month
from gateway.usage_store.rows import coarser, row_of, rows_of
from gateway.usage_store.schema import ALL_KEYS
from gateway.usage_store.sketch import BUCKETS, quantile, quantiles
from tests.support.reference_rollups import rollups


def _rows(n: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ts_ms = 1_764_000_000_000 + rng.randrange(3 * DAY_S * 1000)
        fields = {
            "key_id": f"k{rng.randrange(3)}",
            "model": f"m{rng.randrange(2)}",
            "provider": rng.choice(["up", "engine", ""]),
            "thinking": rng.choice(["on", "off", ""]),
            "status": rng.choice(["200", "502"]),
            "error_code": rng.choice(["", "upstream_error"]),
            "prompt_tokens": str(rng.randrange(100)),
            "cached_tokens": str(rng.randrange(10)),
            "completion_tokens": str(rng.randrange(100)),
            "reasoning_tokens": str(rng.randrange(5)),
            "cost": str(rng.random() / 100),
            "latency_ms": str(rng.lognormvariate(5, 1.5)),
            "ttft_ms": rng.choice(["", str(rng.lognormvariate(3, 1))]),
        }
        rows.append(row_of(f"{ts_ms}-{i}", fields, frozenset({"engine"})))
    return rows


def test_entries_as_bytes_make_the_rows_of_their_decoded_fields() -> None:
    """`rows_of` reads the client's bytes without decoding what it does not keep; whatever the
    values (digits beyond ASCII, bytes that are not UTF-8, NUL, no time, not finite), each row
    is what `row_of` makes of the entry decoded."""
    local = frozenset({"engine"})
    entries: list[tuple[bytes, dict[bytes, bytes]]] = [
        (
            f"{row['record_id']}".encode(),
            {k.encode(): str(v).encode() for k, v in row.items() if k not in ("record_id",)},
        )
        for row in _rows(50, 1)
    ]
    entries += [
        (b"1-0", {b"status": "２００".encode(), b"cost": b"\xff1", b"ttft_ms": "１.５".encode()}),
        (b"2-0", {b"key_id": b"k\xffx", b"ts": b"not a time", b"provider": b"engine"}),
        (b"3-0", {b"status": b"2\x0000", b"model": b"m\x00", b"latency_ms": b"inf"}),
        (b"4-0", {b"prompt_tokens": b" 7 ", b"thinking": b"on-and-on", b"ts": b""}),
    ]

    def decoded(entry_id: bytes, fields: dict[bytes, bytes]) -> dict[str, object]:
        text = {
            k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in fields.items()
        }
        return row_of(entry_id.decode(), text, local)

    assert rows_of(entries, local) == [decoded(i, f) for i, f in entries]
    text_entries = [(i.decode(), {k.decode(): v.decode("utf-8", "replace") for k, v in f.items()})
                    for i, f in entries]  # fmt: skip
    assert rows_of(text_entries, local) == [decoded(i, f) for i, f in entries]


@pytest.mark.parametrize("seed", range(5))
def test_the_daily_rollup_folds_from_the_hourly_one(seed: int) -> None:
    rows = _rows(500, seed)
    folded = coarser(rollups(rows, HOUR_S), DAY_S)
    direct = rollups(rows, DAY_S)
    assert [r[:8] for r in folded] == [r[:8] for r in direct]
    assert folded == [pytest.approx(r) for r in direct]
    assert sum(r[8] for r in folded) == 500  # requests


@pytest.mark.parametrize("seed", range(5))
def test_the_all_keys_rollups_fold_from_the_keyed_ones(seed: int) -> None:
    """Folded to every key together, the keyed increments equal the rollups of the same rows
    with one key for all, without the key's column; so do the rows rolled up without it."""
    rows = _rows(500, seed)
    one_key = [{**row, "key_id": ""} for row in rows]
    for bucket_s in (HOUR_S, DAY_S):
        folded = coarser(rollups(rows, HOUR_S), bucket_s, ALL_KEYS)
        direct = [[r[0], *r[2:]] for r in rollups(one_key, bucket_s)]
        assert [r[:7] for r in folded] == [r[:7] for r in direct]
        assert folded == [pytest.approx(r) for r in direct]
        assert rollups(rows, bucket_s, ALL_KEYS) == [pytest.approx(r) for r in direct]
        assert sum(r[7] for r in folded) == 500  # requests


@pytest.mark.parametrize("seed", range(50))
def test_two_quantiles_in_one_pass_read_as_two_single_ones(seed: int) -> None:
    rng = random.Random(seed)
    counts: list[int | None] = [rng.choice([0, 0, 1, 5, 100]) for _ in range(BUCKETS)]
    counts[rng.randrange(BUCKETS)] = None  # a SQL sum over no rows
    plain = [n or 0 for n in counts]
    low, high = sorted((rng.random(), rng.random()))
    low = max(low, 0.01)
    assert quantiles(counts, low, high) == (quantile(plain, low), quantile(plain, high))


def test_an_empty_histogram_has_no_quantiles() -> None:
    assert quantiles([0] * BUCKETS, 0.5, 0.95) == (None, None)
    assert quantiles([None] * BUCKETS, 0.5, 0.95) == (None, None)


def test_month_buckets_start_on_the_first_of_the_utc_month() -> None:
    def at(*parts: int) -> int:
        return int(datetime(*parts, tzinfo=UTC).timestamp())

    assert bucket_start(at(2028, 2, 29, 23, 59, 59), MONTH) == at(2028, 2, 1)
    assert bucket_start(at(2028, 3, 1), MONTH) == at(2028, 3, 1)
    assert next_month(at(2028, 1, 1)) == at(2028, 2, 1)
    assert next_month(at(2026, 12, 1)) == at(2027, 1, 1)
    assert bucket_start(at(2026, 5, 7, 13), DAY_S) == at(2026, 5, 7)
    # the daily totals by key folded into months: each month's sum of its days
    rows = [{**r, "ts_ms": r["ts_ms"] + i % 90 * DAY_S * 1000} for i, r in enumerate(_rows(500, 3))]
    days = coarser(rollups(rows, HOUR_S, ("key_id",)), DAY_S, ("key_id",), ("key_id",))
    months = coarser(days, MONTH, ("key_id",), ("key_id",))
    assert months == [pytest.approx(m) for m in rollups(rows, MONTH, ("key_id",))]
    assert sum(m[2] for m in months) == 500 and len({m[0] for m in months}) == 4
    for month in months:
        inside = [d for d in days if bucket_start(d[0], MONTH) == month[0] and d[1] == month[1]]
        assert month[2] == sum(d[2] for d in inside)
