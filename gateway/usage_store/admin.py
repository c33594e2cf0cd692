"""The usage store's admin API, under /admin (mounted by `gateway.admin.api`):

  GET /admin/usage/summary   rollup totals grouped by any of key, model, provider, route,
                             thinking, status, error_code; per hour, day or month; filtered;
                             ordered by period then groups, paged by `limit` and `cursor`
  GET /admin/usage/records   records newest first, paged by `cursor` (metadata only)
  GET /admin/usage/export    records as CSV, oldest first, streamed (any size)
and the summary of one key (`key_summary`, for GET /admin/keys/{id}/usage). Without
`[usage] enabled` they answer 404 `usage_store_disabled`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidRequest, NotFound
from gateway.resources import SETTINGS, USAGE_STORE
from gateway.usage_store.export_sql import CSV_COLUMNS
from gateway.usage_store.queries import ExportQuery, RecordsQuery, SummaryQuery
from gateway.usage_store.query_errors import query_error
from gateway.usage_store.store import UsageStore

Query = TypeVar("Query", bound=BaseModel)
SUMMARY_PAGE = 1000  # a summary's rows a page when the query names no `limit`


def routes() -> list[web.RouteDef]:
    return [
        web.get("/usage/summary", summary),
        web.get("/usage/records", records),
        web.get("/usage/export", export),
    ]


def _store(request: web.Request) -> UsageStore:
    store = request.config_dict.get(USAGE_STORE)
    if store is None:
        raise NotFound(
            "The usage store is not enabled: set [usage] enabled = true.",
            code="usage_store_disabled",
        )
    return store


def _query(request: web.Request, model: type[Query], **fixed: str) -> Query:
    params: dict[str, Any] = {name: value for name, value in request.query.items() if value}
    for name in params:
        if len(request.query.getall(name)) > 1:
            raise InvalidRequest(f"'{name}' is given more than once.", param=name)
    params.update(fixed)
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        raise query_error(model, exc) from None


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


async def summary_response(request: web.Request, **fixed: str) -> web.Response:
    """The summary of `request`'s query (with `fixed` parameters, e.g. the key of a key's
    own view)."""
    store = _store(request)
    q = _query(request, SummaryQuery, **fixed)
    if q.limit is None:
        q = q.model_copy(update={"limit": SUMMARY_PAGE})
    data, cursor = await store.summary_page(q)
    return web.json_response(
        {
            "object": "usage.summary",
            "currency": request.config_dict[SETTINGS].usage.currency,
            "group_by": q.dimensions(),
            "interval": q.interval,
            "start": _iso(q.start),
            "end": _iso(q.end),
            "filters": {k: v for k, v in q.equalities().items()},
            "data": data,
            "has_more": cursor is not None,
            "next_cursor": cursor,
        }
    )


async def summary(request: web.Request) -> web.Response:
    return await summary_response(request)


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["record_id"],
        "object": "usage.record",
        "created_at": datetime.fromtimestamp(row["ts_ms"] / 1000, UTC).isoformat(),
        **{k: v for k, v in row.items() if k not in ("record_id", "ts_ms")},
    }


async def records(request: web.Request) -> web.Response:
    store = _store(request)
    q = _query(request, RecordsQuery)
    rows, cursor = await store.records(q)
    return web.json_response(
        {
            "object": "list",
            "data": [_public(row) for row in rows],
            "has_more": cursor is not None,
            "next_cursor": cursor,
        }
    )


async def export(request: web.Request) -> web.StreamResponse:
    store = _store(request)
    q = _query(request, ExportQuery)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/csv; charset=utf-8",
            "Content-Disposition": 'attachment; filename="usage.csv"',
            "Cache-Control": "no-store",
        }
    )
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write((",".join(CSV_COLUMNS) + "\n").encode())
    async for chunk in store.export_csv(q):
        await response.write(chunk)
    await response.write_eof()
    return response
