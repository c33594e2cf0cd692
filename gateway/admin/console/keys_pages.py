"""The Keys pages: list with search, create (the secret shown once), edit limits, budget and
policy, disable, rotate and revoke, and a key's own usage plot and recent requests. Through
the admin API's own key store (`KeyStore`) and the usage store's functions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import structlog
from aiohttp import web

from gateway.admin.console.forms import FormError, key_create, key_update
from gateway.admin.console.ranges import ViewError, read_view
from gateway.admin.console.summaries import Summaries
from gateway.admin.console.usage_pages import period_series
from gateway.admin.console.web import KEYS, SUMMARIES, Answer, handoff_of, page
from gateway.errors import GatewayError
from gateway.keys.records import KeyRecord, KeyUpdate
from gateway.resources import USAGE_STORE
from gateway.usage_store.queries import RecordsQuery, SummaryQuery
from gateway.usage_store.store import UsageStore

log = structlog.get_logger("gateway.admin.console")

PAGE_SIZE = 50


def routes() -> list[web.RouteDef]:
    return [
        web.get("/keys", list_keys),
        web.post("/keys", create_key),
        web.get("/keys/{id}", key_detail),
        web.get("/keys/{id}/secret", show_secret),
        web.post("/keys/{id}", edit_key),
        web.post("/keys/{id}/disable", disable_key),
        web.post("/keys/{id}/rotate", rotate_key),
        web.post("/keys/{id}/revoke", revoke_key),
    ]


def _state(record: KeyRecord, now: datetime) -> str:
    if record.disabled:
        return "disabled"
    return "expired" if record.is_expired(now) else "active"


def _matches(record: KeyRecord, q: str) -> bool:
    hay = " ".join([record.id, record.name, record.hint, *record.metadata.values()]).lower()
    return all(word in hay for word in q.lower().split())


def _period_start(period: str | None, now: datetime) -> datetime | None:
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None


async def _budget_used(
    summaries: Summaries, store: UsageStore, records: list[KeyRecord], now: datetime
) -> dict[str, int]:
    """Tokens used per key in its budget's current period: one rollup query per period kind."""
    used: dict[str, int] = {}
    for period in {r.budget_period for r in records if r.budget_tokens is not None}:
        start = _period_start(period, now)
        q = SummaryQuery(group_by="key", start=start, latency=False)
        rows = await summaries.summary(store, q)
        wanted = {
            r.id for r in records if r.budget_tokens is not None and r.budget_period == period
        }
        for row in rows:
            if row["key"] in wanted:
                used[row["key"]] = row["prompt_tokens"] + row["completion_tokens"]
    return used


async def list_keys(request: web.Request) -> web.Response:
    handoff, session = handoff_of(request)
    flash = await handoff.take_flash(session)
    now = datetime.now(UTC)
    q = request.query.get("q", "").strip()[:200]
    state = request.query.get("state", "")
    records = [r for r in await request.app[KEYS].list() if not q or _matches(r, q)]
    if state in ("active", "disabled", "expired"):
        records = [r for r in records if _state(r, now) == state]
    records.reverse()  # newest first
    try:
        number = max(1, int(request.query.get("page", "1")))
    except ValueError:
        number = 1
    shown = records[(number - 1) * PAGE_SIZE : number * PAGE_SIZE]
    store: UsageStore | None = request.config_dict.get(USAGE_STORE)
    used = await _budget_used(request.app[SUMMARIES], store, shown, now) if store else {}
    last = await store.last_use([r.id for r in shown]) if store else {}
    rows = [
        {
            "record": r,
            "state": _state(r, now),
            "used": used.get(r.id, 0) if store else None,
            "last_use": last.get(r.id),
        }
        for r in shown
    ]
    return page(
        request,
        "keys.jinja",
        title="Keys",
        rows=rows,
        q=q,
        state=state,
        page_number=number,
        more=len(records) > number * PAGE_SIZE,
        total=len(records),
        usage_enabled=store is not None,
        error=flash.get("error"),
        notice=flash.get("notice"),
        form=flash.get("form", {}),
    )


async def create_key(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    handoff, session = handoff_of(request)
    try:
        body = key_create(form)
        secret, record = await request.app[KEYS].create(body)
    except (FormError, GatewayError) as exc:
        values = {k: v for k, v in form.items() if k != "csrf" and isinstance(v, str)}
        await handoff.put_flash(session, error=str(exc), form=values)
        raise web.HTTPSeeOther(location="/admin/ui/keys") from None
    log.info("api_key_created", key_id=record.id, name=record.name, via="console")
    await handoff.put_secret(session, record.id, secret)
    raise web.HTTPSeeOther(location=f"/admin/ui/keys/{record.id}/secret?created=1")


async def show_secret(request: web.Request) -> web.Response:
    """The secret a create or rotate just handed over, once: a reload finds none."""
    record = await _record(request)
    handoff, session = handoff_of(request)
    secret = await handoff.take_secret(session, record.id)
    created = request.query.get("created") == "1"
    return page(
        request,
        "secret.jinja",
        title="Key created" if created else "Key rotated",
        record=record,
        secret=secret,
        action="created" if created else "rotated",
    )


async def _record(request: web.Request) -> KeyRecord:
    """The key of the path; a console page saying it was revoked (410), or that there is no
    such key (404), raised when there is none."""
    key_id = request.match_info["id"]
    store = request.app[KEYS]
    try:
        return await store.get(key_id)
    except GatewayError:
        pass
    revoked = await store.revoked(key_id)
    if revoked is None:
        raise Answer(
            page(
                request,
                "error.jinja",
                status=404,
                heading="No such key",
                message=f"There is no key with id {key_id}.",
            )
        )
    raise Answer(
        page(request, "revoked.jinja", status=410, title=revoked.record.name, revoked=revoked)
    )


async def key_detail(request: web.Request) -> web.Response:
    record = await _record(request)
    handoff, session = handoff_of(request)
    flash = await handoff.take_flash(session)
    store: UsageStore | None = request.config_dict.get(USAGE_STORE)
    plot: dict[str, Any] | None = None
    recent: list[dict[str, Any]] = []
    view = None
    if store is not None:
        try:
            view = read_view(request.query)
        except ViewError as exc:
            return page(request, "error.jinja", status=400, message=str(exc))
        rows = await request.app[SUMMARIES].summary(
            store,
            SummaryQuery(
                key=record.id, start=view.start, end=view.end, interval=view.interval, latency=False
            ),
        )
        plot = period_series(
            view,
            rows,
            {
                "requests": lambda r: r["requests"],
                "tokens": lambda r: r["prompt_tokens"] + r["completion_tokens"],
            },
        )
        recent, _ = await store.records(RecordsQuery(key=record.id, limit=20))
    return page(
        request,
        "key.jinja",
        title=record.name,
        record=record,
        state=_state(record, datetime.now(UTC)),
        policy=record.policy,
        plot=plot,
        recent=recent,
        view=view,
        usage_enabled=store is not None,
        saved=request.query.get("saved") == "1",
        error=flash.get("error"),
    )


async def edit_key(request: web.Request) -> web.StreamResponse:
    record = await _record(request)
    form = await request.post()
    try:
        patch = key_update(form)
        await request.app[KEYS].update(record.id, patch)
    except (FormError, GatewayError, ValueError) as exc:
        handoff, session = handoff_of(request)
        await handoff.put_flash(session, error=str(exc))
        raise web.HTTPSeeOther(location=f"/admin/ui/keys/{record.id}") from None
    log.info(
        "api_key_updated", key_id=record.id, fields=sorted(patch.model_fields_set), via="console"
    )
    raise web.HTTPSeeOther(location=f"/admin/ui/keys/{record.id}?saved=1")


async def disable_key(request: web.Request) -> web.StreamResponse:
    record = await _record(request)
    form = await request.post()
    disabled = form.get("disabled") == "1"
    await request.app[KEYS].update(record.id, KeyUpdate(disabled=disabled))
    log.info("api_key_updated", key_id=record.id, fields=["disabled"], via="console")
    raise web.HTTPSeeOther(location=f"/admin/ui/keys/{record.id}?saved=1")


async def rotate_key(request: web.Request) -> web.StreamResponse:
    record = await _record(request)
    secret, record = await request.app[KEYS].rotate(record.id)
    log.info("api_key_rotated", key_id=record.id, via="console")
    handoff, session = handoff_of(request)
    await handoff.put_secret(session, record.id, secret)
    raise web.HTTPSeeOther(location=f"/admin/ui/keys/{record.id}/secret")


async def revoke_key(request: web.Request) -> web.StreamResponse:
    record = await _record(request)
    await request.app[KEYS].revoke(record.id)
    log.info("api_key_revoked", key_id=record.id, via="console")
    handoff, session = handoff_of(request)
    await handoff.put_flash(session, notice=f"Key {record.name} ({record.id}) was revoked.")
    raise web.HTTPSeeOther(location="/admin/ui/keys")
