"""From a usage stream entry to a `usage_records` row; rollup increments folded to a coarser
grain (the schema's migrations fill monthly rollups from daily ones by it)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from itertools import islice
from operator import add, itemgetter
from typing import Any

from gateway.usage_store.buckets import MONTH, bucket_start
from gateway.usage_store.schema import DIMENSIONS


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


def _decoded(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


# `_row`'s reading of the fields: (column, field name as bytes, longest) for text,
# (column, field name as bytes) for whole numbers.
_TEXT_BYTES = tuple((column, column.encode(), longest) for column, longest in _TEXT)
_INT_BYTES = tuple((column, column.encode()) for column in _INT)


def _row(entry_id: bytes, fields: Mapping[bytes, bytes], local: frozenset[str]) -> dict[str, Any]:
    """The row of one entry whose id and fields are the client's bytes (with no NUL in them),
    each field decoded inline."""
    get = fields.get
    ident = entry_id.decode()
    ts = get(b"ts")
    provider = get(b"provider")
    provider_text = provider.decode("utf-8", "replace") if provider else ""
    row: dict[str, Any] = {
        "record_id": ident,
        "ts_ms": _ts_ms(ts.decode("utf-8", "replace") if ts else None, ident),
        "provider": provider_text[:100],
        "route": "" if not provider_text else ("local" if provider_text in local else "upstream"),
    }
    for column, field, longest in _TEXT_BYTES:
        value = get(field)
        row[column] = value.decode("utf-8", "replace")[:longest] if value else ""
    for column, field in _INT_BYTES:
        value = get(field)
        try:
            row[column] = int(value) if value else 0
        except ValueError:
            row[column] = _int(value)
    row["cost"] = _float(get(b"cost")) or 0.0
    row["latency_ms"] = _float(get(b"latency_ms")) or 0.0
    row["ttft_ms"] = _float(get(b"ttft_ms"))
    return row


def row_of(entry_id: str, fields: Mapping[str, str], local: frozenset[str]) -> dict[str, Any]:
    """The row for stream entry `entry_id` (its `fields` decoded); `local`: the names of the
    local engine's providers (their route is "local", any other provider's "upstream").
    Any entry makes a storable row (text cut to its column, NUL removed: PostgreSQL refuses
    it), so that no record can stop the consumer."""
    encoded = {
        name.encode(): value.replace("\x00", "").encode("utf-8", "surrogatepass")
        for name, value in fields.items()
    }
    return _row(entry_id.encode(), encoded, local)


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
                made.append(_row(entry_id, fields, local))
                continue
            fields = {_decoded(k): _decoded(v) for k, v in fields.items()}
        ident = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        made.append(row_of(ident, fields, local))
    return made


def coarser(
    increments: Iterable[list[Any]],
    bucket_s: int,
    dims: tuple[str, ...] = DIMENSIONS,
    source: tuple[str, ...] = DIMENSIONS,
) -> list[list[Any]]:
    """Rollup increments (`bucket`, the dimensions `source`, then added values) of buckets that
    divide `bucket_s`, folded into buckets of `bucket_s` seconds (or MONTH) and the dimensions
    `dims` (of `source`, in its order): what rolling the same rows up at that grain makes,
    without reading them again. Values in the order of `bucket`, `dims`, the added ones."""
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
