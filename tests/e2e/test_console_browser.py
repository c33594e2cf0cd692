"""The admin console in real Chromium (Playwright): sign in, create a key and copy its secret,
use it from the openai SDK, see the request in Requests and the plots drawn, edit the key's
limits and see their effect, download the explorer's CSV and check it against the admin API,
revoke the key and see the next request refused, watch Live refresh; no CSP violation on the
way, and no page wider than a 375 px phone."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.console import ADMIN_KEY, ConsoleGateway

pytestmark = pytest.mark.slow

# The innermost elements that reach past the viewport's right edge (for the failure message).
WIDER_THAN_THE_SCREEN = """
[...document.querySelectorAll("body *")]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth)
  .filter(e => ![...e.children].some(c => c.getBoundingClientRect().right > window.innerWidth))
  .slice(0, 5)
  .map(e => e.tagName + "." + e.className + ":" + Math.round(e.getBoundingClientRect().right))
"""


async def _admin_summary(root: str, **params: str) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{root}/admin/usage/summary",
            params=params,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as resp,
    ):
        assert resp.status == 200
        body = await resp.json()
        return list(body["data"])


async def test_console_in_chromium(console_gateway: ConsoleGateway, browser_page: Any) -> None:
    page = browser_page
    root = console_gateway.root
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("dialog", lambda d: asyncio.ensure_future(d.accept()))
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=root)

    await page.goto(f"{root}/admin/ui/keys")
    assert "/admin/ui/login" in page.url
    await page.get_by_label("Admin key").fill(ADMIN_KEY)
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("heading", name="Keys").wait_for()
    cookies = await page.context.cookies()
    assert [c["httpOnly"] for c in cookies if c["name"] == "gw_console"] == [True]
    assert all(ADMIN_KEY not in c["value"] for c in cookies)

    await page.get_by_text("Create a key").click()
    await page.get_by_label("Name", exact=True).fill("browser-key")
    await page.get_by_label("Budget (tokens)", exact=True).fill("500000")
    await page.get_by_role("button", name="Create key").click()
    secret = (await page.locator("#secret").inner_text()).strip()
    await page.get_by_role("button", name="Copy").click()
    await page.get_by_text("Copied.").wait_for()
    assert await page.evaluate("navigator.clipboard.readText()") == secret
    await page.get_by_role("link", name="Go to the key").click()
    key_id = (await page.locator("main p code").first.inner_text()).strip()
    assert secret not in await page.content()

    client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=secret, max_retries=0)
    try:
        await client.chat.completions.create(
            model="echo-model", messages=[{"role": "user", "content": "from the browser test"}]
        )
        deadline = time.monotonic() + 20
        while True:
            await page.goto(f"{root}/admin/ui/requests?key={key_id}")
            if await page.get_by_role("cell", name="echo-model").count():
                break
            assert time.monotonic() < deadline, "the request never showed in Requests"
            await asyncio.sleep(0.2)

        await page.goto(f"{root}/admin/ui/overview?range=24h&key={key_id}")
        await page.locator('[data-plot="plot-requests"] canvas').wait_for()
        assert await page.locator(".plot-area canvas").count() == 5
        totals = page.locator(".totals div").first
        assert (await totals.locator("dd").inner_text()).strip() == "1"

        # Limit the key to another model: echo-model is refused from then on.
        await page.goto(f"{root}/admin/ui/keys/{key_id}")
        await page.get_by_label("Models (comma-separated, empty: all)").fill("fallback-model")
        await page.get_by_role("button", name="Save").click()
        await page.get_by_text("Saved.").wait_for()
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(
                model="echo-model", messages=[{"role": "user", "content": "refused"}]
            )
        assert refused.value.status_code in (403, 404)

        # The explorer's CSV is exactly the admin API's summary of the same range.
        await page.goto(f"{root}/admin/ui/usage?range=24h&interval=hour&group_by=key")
        await page.locator('[data-plot="plot-usage"] canvas').wait_for()
        async with page.expect_download() as download_info:
            await page.get_by_role("link", name="Download this table as CSV").click()
        download = await download_info.value
        rows = list(csv.DictReader(io.StringIO((await download.path()).read_text())))
        end = time.time() // 3600 * 3600 + 3600
        api = await _admin_summary(
            root,
            group_by="key",
            start=datetime.fromtimestamp(end - 86400, UTC).isoformat(),
            end=datetime.fromtimestamp(end, UTC).isoformat(),
        )
        assert sorted((r["key"], int(r["requests"])) for r in rows) == sorted(
            (r["key"], r["requests"]) for r in api
        )

        await page.goto(f"{root}/admin/ui/keys/{key_id}")
        await page.get_by_role("button", name="Revoke").click()
        await page.get_by_role("heading", name="Keys").wait_for()
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(
                model="fallback-model", messages=[{"role": "user", "content": "revoked"}]
            )
    finally:
        await client.close()

    await page.goto(f"{root}/admin/ui/live")
    async with page.expect_response(lambda r: r.url.endswith("/admin/ui/live/state")) as state:
        pass
    assert (await state.value).status == 200

    await page.set_viewport_size({"width": 375, "height": 800})
    for path in ("overview?range=24h", "keys", "requests", "usage?range=24h", "live"):
        await page.goto(f"{root}/admin/ui/{path}")
        width = await page.evaluate("document.documentElement.scrollWidth")
        wide = await page.evaluate(WIDER_THAN_THE_SCREEN)
        assert width <= 375, f"{path} is {width} px wide on a phone: {wide}"
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.textContent") == "Skip to content"
    assert problems == []
