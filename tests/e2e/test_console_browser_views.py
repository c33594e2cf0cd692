"""The console's views in real Chromium (Playwright), where what a person sees matters: plots of
data with single points draw a visible series, a reload after a create or a rotation repeats
nothing and shows no secret, revoke asks first and a revoked key's page says when, /admin/ui
and unknown pages are console pages with the headers, the Requests table fits 1280 px, Keys
shows budget used and last use at 375 px, and the stacked plot's legend is in table order."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from gateway.usage_store.rows import row_of
from gateway.usage_store.store import UsageStore
from testkit.gateway_app import REDIS_URL
from tests.support.console import ADMIN_KEY, ConsoleGateway
from tests.support.usage_records import stream_fields

pytestmark = pytest.mark.slow

# How many pixels of a plot's canvas are in a colour (a series: every series colour is
# saturated), not grey (the grid and axes); the legend is not on the canvas at all.
SERIES_PIXELS = """
(selector) => {
  const canvas = document.querySelector(selector + " canvas");
  if (!canvas) return -1;
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < data.length; i += 4) {
    const hi = Math.max(data[i], data[i + 1], data[i + 2]);
    const lo = Math.min(data[i], data[i + 1], data[i + 2]);
    if (hi - lo > 80 && data[i + 3] > 128) n++;
  }
  return n;
}
"""


async def _one_hour_of_traffic(path: Path, key_id: str, revoked_id: str) -> None:
    """Records in the last hour only: in a 7-day hourly view, one period of 168 has data. The
    oldest is of a key since revoked."""
    store = await UsageStore.open(f"sqlite+aiosqlite:///{path}")
    now = time.time()
    rows = []
    for i in range(6):
        fields = stream_fields(
            i,
            now - 60 - i,
            key_id=key_id if i < 5 else revoked_id,
            model="deepseek-reasoner-with-a-long-name",
            provider="an-upstream-provider",
            route_reason="auto: thinking on (the ask reads as hard), local queue full, upstream",
            route_model="deepseek-reasoner-with-a-long-name-upstream",
            route="provider=an-upstream-provider; model=deepseek-reasoner-with-a-long-name; "
            "thinking=on; reason=auto",
            status="200" if i else "502",
            error_code="" if i else "upstream_unavailable",
        )
        rows.append(row_of(f"{int((now - 60 - i) * 1000)}-{i}", fields, frozenset()))
    try:
        await store.insert(rows)
    finally:
        await store.aclose()


async def _sign_in(page: Any, root: str, target: str) -> None:
    await page.goto(f"{root}{target}")
    await page.get_by_label("Admin key").fill(ADMIN_KEY)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_load_state()


async def test_plots_of_single_points_draw_and_the_tables_fit(
    console_gateway: ConsoleGateway, browser_page: Any, tmp_path: Path, redis_prefix: str
) -> None:
    page, root = browser_page, console_gateway.root
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    redis = Redis.from_url(REDIS_URL)
    keys = KeyStore(redis, prefix=redis_prefix)
    _, gone = await keys.create(KeyCreate(name="revoked-since"))
    await keys.revoke(gone.id)
    await redis.aclose()
    await _one_hour_of_traffic(tmp_path / "usage.db", console_gateway.user_key_id, gone.id)
    await _sign_in(page, root, "/admin/ui/overview?range=7d&interval=hour")
    await page.locator('[data-plot="plot-latency"] canvas').wait_for()
    for plot in ("requests", "tokens", "cost", "errors", "latency"):
        drawn = await page.evaluate(SERIES_PIXELS, f'[data-plot="plot-{plot}"]')
        assert drawn > 20, f"the {plot} plot draws no series ({drawn} pixels in colour)"

    # Requests fits a 1280 px window: every column, Cost included, and the key's name with
    # its id on hover.
    await page.set_viewport_size({"width": 1280, "height": 900})
    await page.goto(f"{root}/admin/ui/requests")
    table = page.locator("table.records")
    await table.wait_for()
    assert await page.evaluate("document.documentElement.scrollWidth") <= 1280
    box = await table.bounding_box()
    scroller = await page.locator("main .scroll").first.bounding_box()
    assert box and scroller and box["x"] + box["width"] <= scroller["x"] + scroller["width"] + 1
    cost = await page.get_by_role("columnheader", name="Cost").bounding_box()
    assert cost and cost["x"] + cost["width"] <= 1280
    rows = page.locator("table.records tbody tr")
    for row, name, key_id in (
        (0, "user", console_gateway.user_key_id),
        (5, "revoked-since", gone.id),
    ):
        link = rows.nth(row).locator("td").nth(1).locator("a")
        assert (await link.inner_text()).strip() == name
        assert await link.get_attribute("title") == key_id

    # The stacked plot's legend lists the groups in the table's order.
    await page.goto(f"{root}/admin/ui/usage?range=24h&interval=hour&group_by=status")
    await page.locator('[data-plot="plot-usage"] canvas').wait_for()
    legend = [
        (await s.inner_text()).strip()
        for s in await page.locator('[data-plot="plot-usage"] .u-legend .u-series .u-label').all()
    ][1:]  # the first is the time axis
    table_order = [
        (await c.inner_text()).strip()
        for c in await page.locator("table.usage tbody tr td:first-child").all()
    ]
    assert table_order == ["200", "502"] and [s.rstrip(":") for s in legend] == table_order

    # Keys on a phone: budget used and last use are on the screen, labelled.
    await page.set_viewport_size({"width": 375, "height": 800})
    await page.goto(f"{root}/admin/ui/keys")
    for label in ("Budget used", "Last use"):
        cell = page.locator(f'table.keys td[data-label="{label}"]').first
        assert await cell.is_visible(), label
        where = await cell.bounding_box()
        assert where and where["x"] + where["width"] <= 375, label
    assert await page.evaluate("document.documentElement.scrollWidth") <= 375
    assert problems == []


async def test_a_reload_repeats_nothing_and_pages_stay_in_the_console(
    console_gateway: ConsoleGateway, browser_page: Any
) -> None:
    page, root = browser_page, console_gateway.root
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        asyncio.ensure_future(dialog.accept())

    page.on("dialog", on_dialog)
    await _sign_in(page, root, "/admin/ui")  # the address the docs give, without its slash
    await page.get_by_role("heading", name="Overview").wait_for()
    answer = await page.goto(f"{root}/admin/ui")
    assert answer and answer.url.endswith("/admin/ui/overview")
    await page.get_by_role("heading", name="Overview").wait_for()

    await page.goto(f"{root}/admin/ui/keys")
    keys_before = await page.locator("table.keys tbody tr").count()
    await page.get_by_text("Create a key").click()
    await page.get_by_label("Name", exact=True).fill("reload-key")
    await page.get_by_role("button", name="Create key").click()
    secret = (await page.locator("#secret").inner_text()).strip()
    await page.reload()
    await page.get_by_text("cannot be shown again").wait_for()
    assert secret not in await page.content()
    await page.goto(f"{root}/admin/ui/keys")
    assert await page.locator("table.keys tbody tr").count() == keys_before + 1

    # Rotate (asks first), reload: no second rotation, the new secret keeps working.
    await page.get_by_role("link", name="reload-key").click()
    await page.get_by_role("button", name="Rotate secret").click()
    rotated = (await page.locator("#secret").inner_text()).strip()
    await page.reload()
    await page.get_by_text("cannot be shown again").wait_for()
    client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=rotated, max_retries=0)
    try:
        await client.chat.completions.create(
            model="echo-model", messages=[{"role": "user", "content": "after the reload"}]
        )
        old = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=secret, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            await old.chat.completions.create(
                model="echo-model", messages=[{"role": "user", "content": "old secret"}]
            )
        await old.close()
        assert "rotated" in refused.value.message
    finally:
        await client.close()

    # Revoke asks, says it was done, and the key's page says when.
    await page.get_by_role("link", name="Go to the key").click()
    key_url = page.url
    await page.get_by_role("button", name="Revoke").click()
    await page.get_by_text("was revoked.").wait_for()
    assert [d.split(":")[0] for d in dialogs] == ["Rotate", "Revoke reload-key"]
    await page.reload()
    assert await page.get_by_text("was revoked.").count() == 0  # said once
    answer = await page.goto(key_url)
    assert answer and answer.status == 410
    await page.get_by_text("This key was revoked on ").wait_for()

    answer = await page.goto(f"{root}/admin/ui/no-such-thing")
    assert answer and answer.status == 404
    await page.get_by_role("heading", name="No such page").wait_for()
    headers = await answer.all_headers()
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-store"
    assert await page.get_by_role("link", name="Keys").count() == 1  # the console's own page


async def test_refusals_show_in_the_overview_and_the_groupings(
    console_gateway: ConsoleGateway, browser_page: Any, redis_prefix: str
) -> None:
    page, root = browser_page, console_gateway.root
    redis = Redis.from_url(REDIS_URL)
    secret, record = await KeyStore(redis, prefix=redis_prefix).create(
        KeyCreate(name="limited", rpm=1)
    )
    await redis.aclose()
    client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=secret, max_retries=0)
    try:
        await client.chat.completions.create(
            model="echo-model", messages=[{"role": "user", "content": "first"}]
        )
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(
                model="echo-model", messages=[{"role": "user", "content": "one too many"}]
            )
    finally:
        await client.close()
    await _sign_in(page, root, f"/admin/ui/requests?key={record.id}&status=429")
    deadline = time.monotonic() + 20
    while not await page.get_by_text("rate_limit_exceeded").count():
        assert time.monotonic() < deadline, "the refusal never showed in Requests"
        await asyncio.sleep(0.2)
        await page.reload()
    assert await page.get_by_text("(failed before routing)").count() == 1

    await page.goto(f"{root}/admin/ui/overview?range=24h&key={record.id}")
    error_rate = page.locator(".totals div", has_text="Error rate").locator("dd")
    assert (await error_rate.inner_text()).strip() == "50.0 %"
    await page.goto(f"{root}/admin/ui/usage?range=24h&group_by=error_code&key={record.id}")
    rows = {
        (await r.locator("td").nth(0).inner_text()).strip(): (
            await r.locator("td").nth(1).inner_text()
        ).strip()
        for r in await page.locator("table.usage tbody tr").all()
    }
    assert rows == {"rate_limit_exceeded": "1", "no error": "1"}
    await page.goto(f"{root}/admin/ui/usage?range=24h&group_by=route&key={record.id}")
    assert await page.get_by_role("cell", name="failed before routing").count() == 1
