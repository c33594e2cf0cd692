"""From a usage stream entry to a `usage_records` row, and from rows to rollup increments."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from itertools import islice
from operator import add, itemgetter
from typing import Any

from gateway.usage_store.buckets import MONTH, bucket_start
from gateway.usage_store.schema import ADDED, DIMENSIONS
from gateway.usage_store.sketch import bucket_of


def _int(value: str | bytes | None) -> int:
    try:
        return int(value or 0)
    except ValueError:  # bytes: read again as text (which takes digits beyond ASCII too)
        return _int(value.decode("utf-8", "replace")) if isinstance(value, bytes) else 0


def _float(value: str | bytes | None) -> float | None:
    try:
        number = float(value) if value else None
    except ValueError:
        return _float(value.decode("utf-8", "replace")) if isinstance(value, bytes) else None
    return number if number is not None and math.isfinite(number) else None


def _ts_ms(value: str | None, entry_id: str) -> int:
    """The record's settlement time; the stream entry id's milliseconds when it has none."""
    try:
        return int(datetime.fromisoformat(value or "").timestamp() * 1000)
    except ValueError:
        return int(entry_id.split("-", 1)[0])


# The row's columns from the stream's fields of the same names: text (cut to its column's
# length), whole numbers, and decimals (`ts`, `provider` and `ttft_ms` are read apart).
_TEXT = (
    ("request_id", 128),
    ("key_id", 64),
    ("model", 200),
    ("route_model", 200),
    ("thinking", 4),
    ("route_reason", 100),
    ("error_code", 100),
)
_INT = (
    "status",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "max_tokens",
    "reserved_tokens",
    "charged_tokens",
)
_FIELDS = ("ts", "provider", "cost", "latency_ms", "ttft_ms", *(c for c, _ in _TEXT), *_INT)
_AS_TEXT = {name: name for name in _FIELDS}  # column -> field name, decoded fields
_AS_BYTES = {name: name.encode() for name in _FIELDS}  # the same, the client's bytes


def _str(value: str | None) -> str:
    return value or ""


def _decoded(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


def _row(
    entry_id: str,
    fields: Mapping[Any, Any],
    names: Mapping[str, Any],
    text: Callable[[Any], str],
    local: frozenset[str],
) -> dict[str, Any]:
    """The row of one entry whose `fields` are named by `names` (column -> field name) and
    read as text by `text` (numbers are read by `_int` and `_float`, from text or bytes)."""
    get = fields.get
    provider = text(get(names["provider"]))
    row: dict[str, Any] = {
        "record_id": entry_id,
        "ts_ms": _ts_ms(text(get(names["ts"])) or None, entry_id),
        "provider": provider[:100],
        "route": "" if not provider else ("local" if provider in local else "upstream"),
    }
    for column, longest in _TEXT:
        row[column] = text(get(names[column]))[:longest]
    for column in _INT:
        row[column] = _int(get(names[column]))
    row["cost"] = _float(get(names["cost"])) or 0.0
    row["latency_ms"] = _float(get(names["latency_ms"])) or 0.0
    row["ttft_ms"] = _float(get(names["ttft_ms"]))
    return row


def row_of(entry_id: str, fields: Mapping[str, str], local: frozenset[str]) -> dict[str, Any]:
    """The row for stream entry `entry_id` (its `fields` decoded); `local`: the names of the
    local engine's providers (their route is "local", any other provider's "upstream").
    Any entry makes a storable row (text cut to its column, NUL removed: PostgreSQL refuses
    it), so that no record can stop the consumer."""
    if any("\x00" in value for value in fields.values()):
        fields = {k: v.replace("\x00", "") for k, v in fields.items()}
    return _row(entry_id, fields, _AS_TEXT, _str, local)


def rows_of(
    entries: Iterable[tuple[Any, Mapping[Any, Any]]], local: frozenset[str]
) -> list[dict[str, Any]]:
    """`row_of` for each stream entry as the Redis client returns it (id and fields as bytes,
    or as text): what `row_of` makes of the decoded entry, without decoding what it does not
    keep (field names, numbers: `int` and `float` read bytes)."""
    made = []
    for entry_id, fields in entries:
        if fields and isinstance(next(iter(fields)), bytes):
            if b"\x00" not in b"".join(fields.values()):
                made.append(_row(entry_id.decode(), fields, _AS_BYTES, _decoded, local))
                continue
            fields = {_decoded(k): _decoded(v) for k, v in fields.items()}
        ident = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        made.append(row_of(ident, fields, local))
    return made


def failed(row: Mapping[str, Any]) -> bool:
    return bool(row["status"] >= 400 or row["error_code"])


ROLLUP_COLUMNS = ("bucket", *DIMENSIONS, *ADDED)  # the order of `rollups`' values
# Positions in ADDED (after the bucket and the dimensions).
_AT = {name: i for i, name in enumerate(ADDED)}
_REQUESTS, _ERRORS, _COST, _LAT_SUM = (
    _AT[c] for c in ("requests", "errors", "cost", "latency_sum_ms")
)
_TTFT_COUNT, _TTFT_SUM = _AT["ttft_count"], _AT["ttft_sum_ms"]
_LAT0, _TTFT0 = _AT["lat_0"], _AT["ttft_0"]
_TOKENS = tuple(
    (name, _AT[name])
    for name in ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
)


Grain = tuple[int, tuple[str, ...], int]  # bucket seconds, dimensions, ADDED columns kept


def rollups(
    rows: Iterable[Mapping[str, Any]], bucket_s: int, dims: tuple[str, ...] = DIMENSIONS
) -> list[list[Any]]:
    """Rollup increments of `rows` in buckets of `bucket_s` seconds by the dimensions `dims`,
    each a list of values in the order of `bucket`, `dims`, `ADDED` (`ROLLUP_COLUMNS` for every
    dimension), sorted by primary key (so that concurrent writers lock rows in one order)."""
    return rollups_at(rows, [(bucket_s, dims, len(ADDED))])[0]


def rollups_at(rows: Iterable[Mapping[str, Any]], grains: Sequence[Grain]) -> list[list[list[Any]]]:
    """`rollups` of `rows` at several grains in one pass over them: per grain (bucket seconds,
    dimensions, how many of the leading ADDED columns: all, or the totals without the
    histograms) its increments in the order of `bucket`, the dimensions, those columns."""
    tables: list[dict[tuple[Any, ...], list[Any]]] = [{} for _ in grains]
    for row in rows:
        second = row["ts_ms"] // 1000
        error = failed(row)
        tokens = [(at, row[name]) for name, at in _TOKENS]
        cost, latency, ttft = row["cost"], row["latency_ms"], row["ttft_ms"]
        latency_at = _LAT0 + bucket_of(latency)
        ttft_at = -1 if ttft is None else _TTFT0 + bucket_of(ttft)
        for (bucket_s, dims, width), groups in zip(grains, tables, strict=True):
            pk = (second // bucket_s * bucket_s, *[row[d] for d in dims])
            group = groups.get(pk)
            if group is None:
                group = groups[pk] = [0] * width
                group[_COST] = group[_LAT_SUM] = group[_TTFT_SUM] = 0.0
            group[_REQUESTS] += 1
            group[_ERRORS] += error
            for at, n in tokens:
                group[at] += n
            group[_COST] += cost
            group[_LAT_SUM] += latency
            if width > _LAT0:
                group[latency_at] += 1
            if ttft is not None:
                group[_TTFT_COUNT] += 1
                group[_TTFT_SUM] += ttft
                if width > _LAT0:
                    group[ttft_at] += 1
    return [[[*pk, *groups[pk]] for pk in sorted(groups)] for groups in tables]


def coarser(
    increments: Iterable[list[Any]],
    bucket_s: int,
    dims: tuple[str, ...] = DIMENSIONS,
    source: tuple[str, ...] = DIMENSIONS,
) -> list[list[Any]]:
    """`rollups` increments by the dimensions `source` (of buckets that divide `bucket_s`)
    folded into buckets of `bucket_s` seconds (or MONTH) and the dimensions `dims` (of
    `source`, in its order): what `rollups` of the same rows makes at that grain, without
    reading them again (the daily rollups from the hourly ones). Values in the order of
    `bucket`, `dims`, `ADDED`."""
    groups: dict[tuple[Any, ...], list[Any]] = {}  # primary key -> the added values
    head = 1 + len(source)
    kept = [1 + source.index(d) for d in dims]
    dims_of = itemgetter(*kept) if len(kept) > 1 else None  # (a tuple of two or more)
    months: dict[int, int] = {}  # bucket -> its month's start (MONTH: read once a bucket)
    for increment in increments:
        second = increment[0]
        if bucket_s != MONTH:
            bucket = second // bucket_s * bucket_s
        elif (bucket := months.get(second)) is None:
            bucket = months[second] = bucket_start(second, MONTH)
        if dims_of is not None:
            pk = (bucket, *dims_of(increment))
        else:
            pk = (bucket, *[increment[i] for i in kept])
        group = groups.get(pk)
        if group is None:
            groups[pk] = increment[head:]
        else:
            groups[pk] = list(map(add, group, islice(increment, head, None)))
    return [[*pk, *groups[pk]] for pk in sorted(groups)]
