"""Overview, Requests and the Usage explorer: pages over the usage store's admin functions
(`UsageStore.summary` on the rollups, `UsageStore.records`), metadata only (never prompt or
answer text). Without `[usage] enabled` they say so."""

from __future__ import annotations

import asyncio
import csv
import io
from collections import defaultdict
from datetime import datetime
from typing import Any

from aiohttp import web

from gateway.admin.console.ranges import (
    GROUPS,
    INTERVALS,
    RANGES,
    View,
    ViewError,
    read_view,
    records_query,
)
from gateway.admin.console.summaries import Summaries
from gateway.admin.console.web import KEYS, SUMMARIES, page
from gateway.resources import SETTINGS, USAGE_STORE
from gateway.usage_store.store import UsageStore

TOP = 10
STACKED = 8  # groups drawn in the explorer's stacked plot; the rest add up as "other"
EXPLORER_COLUMNS = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost",
    "latency_p50_ms",
    "latency_p95_ms",
)
TOTALS_ONLY = EXPLORER_COLUMNS[:7]


def _shows_latency(view: View) -> bool:
    """Whether the explorer shows p50/p95. Not by key: they come from the latency histograms,
    which the rollups keep per key only beside every other dimension (a month of them is some
    100,000 rows at a million records a day, against 30,000 rows of totals); each key's own
    page shows its latency."""
    return view.group_by != "key"


def _columns(view: View) -> tuple[str, ...]:
    return EXPLORER_COLUMNS if _shows_latency(view) else TOTALS_ONLY


def routes() -> list[web.RouteDef]:
    return [
        web.get("/overview", overview),
        web.get("/requests", requests_page),
        web.get("/usage", explorer),
        web.get("/usage.csv", explorer_csv),
    ]


def _store(request: web.Request) -> UsageStore | None:
    return request.config_dict.get(USAGE_STORE)


def _disabled(request: web.Request, title: str) -> web.Response:
    return page(request, "disabled.jinja", title=title)


def _currency(request: web.Request) -> str:
    return request.config_dict[SETTINGS].usage.currency


async def _key_names(request: web.Request) -> dict[str, str]:
    """Key id -> name, revoked keys included (their usage stays in the reports)."""
    return await request.app[KEYS].names()


# What an empty value of a dimension means (the record of a request that failed before a
# route was chosen has no provider or route; thinking is empty where nothing decided it).
BLANK = {
    "thinking": "not decided",
    "route": "failed before routing",
    "provider": "failed before routing",
    "error_code": "no error",
}


def group_label(dimension: str, value: Any) -> str:
    text = "" if value is None else str(value)
    return text or BLANK.get(dimension, "(none)")


def period_series(
    view: View,
    rows: list[dict[str, Any]],
    fields: dict[str, Any],
    gaps: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Plot data: one value per period of the view. Counts and sums are 0 in a period without
    records; the fields named in `gaps` (ratios, latencies) have no value there (None)."""
    x = view.periods()
    at = {stamp: i for i, stamp in enumerate(x)}
    series = {label: [None if label in gaps else 0] * len(x) for label in fields}
    for row in rows:
        i = at.get(int(datetime.fromisoformat(row["period"]).timestamp()))
        if i is None:
            continue
        for label, pick in fields.items():
            series[label][i] = pick(row)
    return {"x": x, "series": [{"label": k, "values": v} for k, v in series.items()]}


BREAKDOWN = ("thinking", "route", "model")


def _totals(rows: list[dict[str, Any]], dimension: str) -> list[dict[str, Any]]:
    """Requests and cost per value of `dimension` (new rows: the given ones are shared)."""
    out: dict[Any, dict[str, Any]] = {}
    for row in rows:
        total = out.setdefault(
            row[dimension], {dimension: row[dimension], "requests": 0, "cost": 0.0}
        )
        total["requests"] += row["requests"]
        total["cost"] += row["cost"]
    return list(out.values())


def _share(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    total = sum(r["requests"] for r in rows) or 1
    return [
        {
            "label": group_label(name, r[name]),
            "requests": r["requests"],
            "share": r["requests"] / total,
        }
        for r in sorted(rows, key=lambda r: -r["requests"])
    ]


def _p(row: dict[str, Any], metric: str, q: str) -> Any:
    return (row.get(metric) or {}).get(q)


async def overview(request: web.Request) -> web.Response:
    store = _store(request)
    if store is None:
        return _disabled(request, "Overview")
    try:
        view = read_view(request.query)
    except ViewError as exc:
        return page(request, "error.jinja", status=400, message=str(exc))
    summaries = request.app[SUMMARIES]
    # The plots' query, one for the shares and the top models (the range's totals by model,
    # thinking and route, added up per dimension here) and one for the top keys, side by side
    # on the store's reader connections. Without a key filter the first two read the all-keys
    # rollups, which are a small fraction of the keyed ones.
    series_rows, mix, by_key = await asyncio.gather(
        summaries.summary(store, view.summary(interval=True, latency=True)),
        summaries.summary(store, view.summary(interval=False, group_by="model,thinking,route")),
        summaries.summary(store, view.summary(interval=False, group_by="key")),
    )
    thinking, route, models = (_totals(mix, d) for d in BREAKDOWN)
    keys = _totals(by_key, "key")
    totals: dict[str, Any] = defaultdict(int)
    for row in series_rows:
        for name in (
            "requests",
            "errors",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
            "reasoning_tokens",
            "cost",
        ):
            totals[name] += row[name]
    plots = {
        "requests": period_series(
            view,
            series_rows,
            {"requests": lambda r: r["requests"], "errors": lambda r: r["errors"]},
        ),
        "tokens": period_series(
            view,
            series_rows,
            {
                "prompt": lambda r: r["prompt_tokens"],
                "cached": lambda r: r["cached_tokens"],
                "completion": lambda r: r["completion_tokens"],
                "reasoning": lambda r: r["reasoning_tokens"],
            },
        ),
        "cost": period_series(view, series_rows, {"cost": lambda r: r["cost"]}),
        "errors": period_series(
            view,
            series_rows,
            {
                "error rate %": lambda r: (
                    round(100 * r["errors"] / r["requests"], 2) if r["requests"] else None
                )
            },
            gaps=frozenset({"error rate %"}),
        ),
        "latency": period_series(
            view,
            series_rows,
            {
                "total p50": lambda r: _p(r, "latency_ms", "p50"),
                "total p95": lambda r: _p(r, "latency_ms", "p95"),
                "TTFT p50": lambda r: _p(r, "ttft_ms", "p50"),
                "TTFT p95": lambda r: _p(r, "ttft_ms", "p95"),
            },
            gaps=frozenset({"total p50", "total p95", "TTFT p50", "TTFT p95"}),
        ),
    }
    names = await _key_names(request)
    top_keys = sorted(keys, key=lambda r: -r["requests"])[:TOP]
    for row in top_keys:
        row["name"] = names.get(row["key"], "")
    return page(
        request,
        "overview.jinja",
        title="Overview",
        view=view,
        ranges=list(RANGES),
        intervals=INTERVALS,
        currency=_currency(request),
        totals=totals,
        error_rate=(totals["errors"] / totals["requests"]) if totals["requests"] else None,
        cache_hit_rate=(totals["cached_tokens"] / totals["prompt_tokens"])
        if totals["prompt_tokens"]
        else None,
        plots=plots,
        thinking=_share(thinking, "thinking"),
        routes=_share(route, "route"),
        top_keys=top_keys,
        top_models=sorted(models, key=lambda r: -r["requests"])[:TOP],
    )


async def requests_page(request: web.Request) -> web.Response:
    store = _store(request)
    if store is None:
        return _disabled(request, "Requests")
    try:
        q = records_query(request.query)
    except ViewError as exc:
        return page(request, "error.jinja", status=400, message=str(exc))
    rows, cursor = await store.records(q)
    names = ("key", "model", "provider", "route", "status", "start", "end")
    filters = {f: request.query.get(f, "") for f in names}
    return page(
        request,
        "requests.jinja",
        title="Requests",
        rows=rows,
        names=await _key_names(request),
        filters=filters,
        next_query={**{k: v for k, v in filters.items() if v}, "cursor": cursor}
        if cursor
        else None,
        currency=_currency(request),
    )


def _explorer_row(row: dict[str, Any], group: str) -> dict[str, Any]:
    latency = row.get("latency_ms") or {}
    return {
        "value": row[group],
        "group": "" if row[group] is None else str(row[group]),
        "label": group_label(group, row[group]),
        **{c: row[c] for c in TOTALS_ONLY},
        "latency_p50_ms": latency.get("p50"),
        "latency_p95_ms": latency.get("p95"),
    }


async def _explore(request: web.Request, store: UsageStore) -> tuple[View, list[dict[str, Any]]]:
    view = read_view(request.query)
    q = view.summary(interval=False, group_by=view.group_by, latency=_shows_latency(view))
    rows = await request.app[SUMMARIES].summary(store, q)
    table = [_explorer_row(r, view.group_by) for r in rows]
    table.sort(key=lambda r: (-r["requests"], r["group"]))
    return view, table


async def explorer(request: web.Request) -> web.Response:
    store = _store(request)
    if store is None:
        return _disabled(request, "Usage")
    try:
        view, table = await _explore(request, store)
    except ViewError as exc:
        return page(request, "error.jinja", status=400, message=str(exc))
    plot = await _stacked_plot(request.app[SUMMARIES], store, view, table)
    names = await _key_names(request) if view.group_by == "key" else {}
    return page(
        request,
        "usage.jinja",
        title="Usage",
        view=view,
        ranges=list(RANGES),
        intervals=INTERVALS,
        groups=GROUPS,
        table=table,
        latency=_shows_latency(view),
        names=names,
        plot=plot,
        currency=_currency(request),
        csv_query=view.query(group_by=view.group_by),
    )


async def _stacked_plot(
    summaries: Summaries, store: UsageStore, view: View, table: list[dict[str, Any]]
) -> dict[str, Any]:
    """Requests per period of the table's first `STACKED` groups, and of the rest together as
    "other" (every group's total less theirs): two queries that read a few rows a period, where
    every group's periods would be thousands of rows (keys over a month)."""
    group = view.group_by
    top = [r["value"] for r in table[:STACKED]]
    by_period, totals = await asyncio.gather(
        summaries.summary(store, view.summary(interval=True, group_by=group), only={group: top}),
        summaries.summary(store, view.summary(interval=True)),
    )
    fields: dict[str, Any] = {}
    for value in top:
        label = group_label(group, value)
        fields[label] = lambda r, value=value: r["requests"] if r[group] == value else None
    plot = _summed(view, by_period, fields)
    if len(table) > STACKED:
        every = _summed(view, totals, {"all": lambda r: r["requests"]})["series"][0]["values"]
        shown = [sum(values) for values in zip(*(s["values"] for s in plot["series"]), strict=True)]
        other = [
            max(total - part, 0)  # answers shared a few seconds apart may differ a little
            for total, part in zip(every, shown or [0] * len(every), strict=True)
        ]
        plot["series"].append({"label": "other", "values": other})
    return plot


def _summed(view: View, rows: list[dict[str, Any]], fields: dict[str, Any]) -> dict[str, Any]:
    """Like `period_series`, but several rows of one period add up (the stacked plot's groups)."""
    x = view.periods()
    at = {stamp: i for i, stamp in enumerate(x)}
    series = {label: [0] * len(x) for label in fields}
    for row in rows:
        i = at.get(int(datetime.fromisoformat(row["period"]).timestamp()))
        if i is None:
            continue
        for label, pick in fields.items():
            value = pick(row)
            if value is not None:
                series[label][i] += value
    return {
        "x": x,
        "stacked": True,
        "series": [{"label": k, "values": v} for k, v in series.items()],
    }


async def explorer_csv(request: web.Request) -> web.Response:
    """Exactly the explorer's table as CSV."""
    store = _store(request)
    if store is None:
        return _disabled(request, "Usage")
    try:
        view, table = await _explore(request, store)
    except ViewError as exc:
        return page(request, "error.jinja", status=400, message=str(exc))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = _columns(view)
    by_key = view.group_by == "key"
    names = await _key_names(request) if by_key else {}
    writer.writerow((view.group_by, *(("name",) if by_key else ()), *columns))
    for row in table:
        named = (names.get(row["group"], ""),) if by_key else ()
        writer.writerow(
            (row["group"], *named, *("" if row[c] is None else row[c] for c in columns))
        )
    name = f"usage-by-{view.group_by}-{view.range}.csv"
    return web.Response(
        text=out.getvalue(),
        content_type="text/csv",
        charset="utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            "Cache-Control": "no-store",
        },
    )
