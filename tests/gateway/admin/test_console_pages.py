"""The console's pages through HTTP, as a signed-in browser uses them: create a key and read its
secret once, use it from the openai SDK, see the request in Requests, Overview, the key's page
and the Usage explorer (whose CSV matches the admin API's summary), edit a key's limits and
see their effect, revoke it and see the next request refused; without the usage store the
usage pages say so."""

from __future__ import annotations

import asyncio
import csv
import html
import io
import json
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import openai
import pytest

from gateway.usage_store.rows import row_of
from gateway.usage_store.store import UsageStore
from testkit.gateway_app import gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream
from tests.support.console import ADMIN_KEY, ConsoleClient, ConsoleGateway
from tests.support.usage_records import stream_fields

SECRET = re.compile(r'<code id="secret">([^<]+)</code>')
KEY_ID = re.compile(r"<code>(key_[0-9a-f]+)</code>")


async def _admin_summary(root: str, **params: str) -> dict[str, object]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{root}/admin/usage/summary",
            params=params,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as resp,
    ):
        assert resp.status == 200
        body: dict[str, object] = await resp.json()
        return body


async def _until_listed(console: ConsoleClient, path: str, needle: str) -> str:
    deadline = time.monotonic() + 20
    while True:
        status, _, text, _ = await console.request("GET", path)
        assert status == 200
        if needle in text:
            return text
        assert time.monotonic() < deadline, f"{needle!r} never showed on {path}"
        await asyncio.sleep(0.05)


PLOT = re.compile(r'<script type="application/json" id="plot-usage">(.*?)</script>', re.S)


async def test_the_explorers_stacked_plot_draws_its_top_groups_and_the_rest_as_other(
    console: ConsoleClient, tmp_path: Path
) -> None:
    """More groups than the plot stacks: the first eight of the table each have their series,
    and "other" per period is every other group's requests added up, as the admin API's summary
    of every group per period says."""
    store = await UsageStore.open(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    now = time.time()
    rows = []
    for m in range(12):  # model m: m + 1 records, spread over the last 20 hours
        for j in range(m + 1):
            ts = now - 3600 * ((m * 7 + j * 5) % 20) - 60
            fields = stream_fields(m * 100 + j, ts, model=f"plot-model-{m:02d}")
            rows.append(row_of(f"{int(ts * 1000)}-{m * 100 + j}", fields, frozenset()))
    try:
        await store.insert(rows)
    finally:
        await store.aclose()
    status, _, page, _ = await console.request(
        "GET", "/admin/ui/usage?range=24h&interval=hour&group_by=model"
    )
    assert status == 200
    found = PLOT.search(page)
    assert found is not None
    plot = json.loads(html.unescape(found.group(1)))
    series = {s["label"]: s["values"] for s in plot["series"]}
    top = [f"plot-model-{m:02d}" for m in range(11, 3, -1)]  # most requests first
    assert list(series) == [*top, "other"]
    end = time.time() // 3600 * 3600 + 3600
    api = await _admin_summary(
        console.root,
        group_by="model",
        interval="hour",
        start=datetime.fromtimestamp(end - 86400, UTC).isoformat(),
        end=datetime.fromtimestamp(end, UTC).isoformat(),
    )
    at = {stamp: i for i, stamp in enumerate(plot["x"])}
    expected = {label: [0] * len(plot["x"]) for label in series}
    for r in api["data"]:  # type: ignore[attr-defined]
        label = r["model"] if r["model"] in top else "other"
        expected[label][at[int(datetime.fromisoformat(r["period"]).timestamp())]] += r["requests"]
    assert series == expected
    assert sum(series["other"]) == 1 + 2 + 3 + 4


async def test_key_lifecycle_and_usage_pages(
    console: ConsoleClient, console_gateway: ConsoleGateway
) -> None:
    created, status, headers, text = await console.post_and_follow(
        "/admin/ui/keys", {"name": "console-made", "rpm": "100", "budget_tokens": "100000"}
    )
    assert status == 200 and headers["Cache-Control"] == "no-store"
    secret = SECRET.search(text)
    key_id = KEY_ID.search(text)
    assert secret and key_id
    secret_text, key = secret.group(1), key_id.group(1)
    # A reload of the page the POST sent to shows the secret no more, and makes no key.
    status, _, again, _ = await console.request("GET", created)
    assert status == 200 and secret_text not in again and "cannot be shown again" in again
    # The secret is shown once: not on the key's page nor in the list.
    for path in (f"/admin/ui/keys/{key}", "/admin/ui/keys"):
        _, _, page, _ = await console.request("GET", path)
        assert secret_text not in page and "console-made" in page

    client = openai.AsyncOpenAI(base_url=f"{console.root}/v1", api_key=secret_text, max_retries=0)
    try:
        answer = await client.chat.completions.create(
            model="echo-model", messages=[{"role": "user", "content": "hello console"}]
        )
        assert answer.choices[0].message.content
        listed = await _until_listed(console, f"/admin/ui/requests?key={key}", "echo-model")
        assert "hello console" not in listed  # metadata only
        _, _, later, _ = await console.request(
            "GET", f"/admin/ui/requests?key={key}&start=2999-01-01T00:00"
        )
        assert "No requests." in later and 'value="2999-01-01T00:00"' in later
        _, _, overview, _ = await console.request("GET", f"/admin/ui/overview?range=24h&key={key}")
        assert 'data-plot="plot-requests"' in overview and '"requests"' in overview
        # over all keys: top keys from the keyed rollups, top models and shares from the
        # all-keys ones
        _, _, everyone, _ = await console.request("GET", "/admin/ui/overview?range=24h")
        assert f'<a href="/admin/ui/keys/{key}">console-made</a></td><td>1</td>' in everyone
        assert "<td>echo-model</td><td>1</td>" in everyone
        assert 'aria-label="upstream share"' in everyone
        _, _, keys_page, _ = await console.request("GET", f"/admin/ui/keys?q={key}")
        assert "<meter" in keys_page and "never" not in keys_page

        status, headers, exported, _ = await console.request(
            "GET", "/admin/ui/usage.csv?range=24h&interval=hour&group_by=key"
        )
        assert status == 200 and headers["Content-Type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(exported)))
        _, _, explorer, _ = await console.request(
            "GET", "/admin/ui/usage?range=24h&interval=hour&group_by=key"
        )
        assert "console-made" in explorer
        # by key, the totals alone (a key's latency is on its overview); by model, p50/p95 too
        assert "p50 ms" not in explorer
        assert exported.splitlines()[0] == (
            "key,name,requests,errors,prompt_tokens,cached_tokens,completion_tokens,"
            "reasoning_tokens,cost"
        )
        _, _, by_model, _ = await console.request("GET", "/admin/ui/usage?range=24h")
        assert '<th scope="col">p95 ms</th>' in by_model
        _, _, key_page, _ = await console.request("GET", f"/admin/ui/keys/{key}")
        assert f'href="/admin/ui/overview?range=7d&amp;key={key}"' in key_page
        end = time.time() // 3600 * 3600 + 3600
        api = await _admin_summary(
            console.root,
            group_by="key",
            start=datetime.fromtimestamp(end - 86400, UTC).isoformat(),
            end=datetime.fromtimestamp(end, UTC).isoformat(),
        )
        expected = {r["key"]: r for r in api["data"]}  # type: ignore[attr-defined]
        assert {r["key"] for r in rows} == set(expected)
        assert {r["name"] for r in rows if r["key"] == key} == {"console-made"}
        for row in rows:
            want = expected[row["key"]]
            assert int(row["requests"]) == want["requests"]
            assert int(row["completion_tokens"]) == want["completion_tokens"]
            assert float(row["cost"]) == pytest.approx(want["cost"])

        # Limit the key to another model: the next request for echo-model is refused.
        status, headers, _ = await console.post(
            f"/admin/ui/keys/{key}",
            {"name": "console-made", "models": "fallback-model", "thinking": "off"},
        )
        assert status == 303 and headers["Location"].endswith("saved=1")
        _, _, detail, _ = await console.request("GET", f"/admin/ui/keys/{key}")
        assert 'value="fallback-model"' in detail and '<option value="off" selected>' in detail
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(
                model="echo-model", messages=[{"role": "user", "content": "again"}]
            )
        assert refused.value.status_code in (403, 404)

        # A refused form is a 303 too, to the page that shows why (once).
        back, status, _, text = await console.post_and_follow(
            f"/admin/ui/keys/{key}", {"name": "x", "rpm": "-1"}
        )
        assert back == f"/admin/ui/keys/{key}" and status == 200 and "rpm" in text
        assert "must be a whole number" not in (await console.request("GET", back))[2]

        back, status, _, listing = await console.post_and_follow(f"/admin/ui/keys/{key}/revoke", {})
        assert back == "/admin/ui/keys" and f"Key console-made ({key}) was revoked." in listing
        assert "was revoked" not in (await console.request("GET", back))[2]  # once
        with pytest.raises(openai.AuthenticationError) as refused:
            await client.chat.completions.create(
                model="fallback-model", messages=[{"role": "user", "content": "after revoke"}]
            )
        assert "revoked" in refused.value.message
        status, headers, gone, _ = await console.request("GET", f"/admin/ui/keys/{key}")
        assert status == 410 and "This key was revoked on " in gone and "console-made" in gone
        assert "script-src 'self'" in headers["Content-Security-Policy"]
    finally:
        await client.close()


async def test_live_page_and_fragment(console: ConsoleClient) -> None:
    status, _, page, _ = await console.request("GET", "/admin/ui/live")
    assert status == 200 and 'data-refresh="/admin/ui/live/state"' in page and "mock" in page
    status, _, fragment, _ = await console.request(
        "GET", "/admin/ui/live/state", headers={"X-Console-Fragment": "1"}
    )
    assert status == 200 and "<html" not in fragment and "Providers" in fragment


async def test_bad_filters_are_a_400_page(console: ConsoleClient) -> None:
    for path in (
        "/admin/ui/overview?range=9y",
        "/admin/ui/usage?group_by=prompt",
        "/admin/ui/requests?status=abc",
        "/admin/ui/usage.csv?interval=week",
    ):
        status, _, text, _ = await console.request("GET", path)
        assert status == 400 and ("Invalid" in text or "Unknown" in text), path


async def test_root_sends_browsers_to_the_console(console_gateway: ConsoleGateway) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"{console_gateway.root}/", headers={"Accept": "text/html"}, allow_redirects=False
        ) as resp:
            assert resp.status == 302 and resp.headers["Location"] == "/admin/ui/"
        async with session.get(f"{console_gateway.root}/") as resp:
            assert resp.status == 200 and (await resp.json()) == {"status": "ok"}


@pytest.fixture
async def without_usage_store(
    mock_upstream: MockUpstream, redis_prefix: str
) -> AsyncIterator[ConsoleClient]:
    settings = gateway_settings(mock_upstream, redis_prefix, admin={"api_key": ADMIN_KEY})
    runner, root = await start_gateway(settings)
    client = ConsoleClient(root)
    try:
        assert await client.login() == 303
        yield client
    finally:
        await client.close()
        await runner.cleanup()


async def test_usage_pages_say_the_store_is_off(without_usage_store: ConsoleClient) -> None:
    for path in ("/admin/ui/overview", "/admin/ui/requests", "/admin/ui/usage"):
        status, _, text, _ = await without_usage_store.request("GET", path)
        assert status == 200 and "usage store is not enabled" in text, path
    status, _, text, _ = await without_usage_store.request("GET", "/admin/ui/keys")
    assert status == 200


async def test_no_console_without_an_admin_key(
    mock_upstream: MockUpstream, redis_prefix: str, tmp_path: Path
) -> None:
    runner, root = await start_gateway(gateway_settings(mock_upstream, redis_prefix))
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{root}/admin/ui/login") as resp,
        ):
            assert resp.status == 403  # the admin API's own answer: disabled
    finally:
        await runner.cleanup()


def _plot(page: str, name: str) -> dict[str, list[object]]:
    found = re.search(
        rf'<script type="application/json" id="plot-{name}">(.*?)</script>', page, re.S
    )
    assert found is not None, name
    data = json.loads(html.unescape(found.group(1)))
    return {s["label"]: s["values"] for s in data["series"]}


async def test_overview_counts_are_zero_in_empty_periods(
    console: ConsoleClient, tmp_path: Path
) -> None:
    """One hour of traffic in a 7-day hourly view: counts and sums are 0 in the other 167
    periods (a series that can be drawn), ratios and latencies have no value there."""
    store = await UsageStore.open(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    now = time.time()
    try:
        await store.insert(
            [
                row_of(f"{int(now * 1000) - i}-{i}", stream_fields(i, now - 60), frozenset())
                for i in range(3)
            ]
        )
    finally:
        await store.aclose()
    status, _, page, _ = await console.request("GET", "/admin/ui/overview?range=7d&interval=hour")
    assert status == 200
    for name, fields in (
        ("requests", ("requests", "errors")),
        ("tokens", ("prompt", "cached", "completion", "reasoning")),
        ("cost", ("cost",)),
    ):
        series = _plot(page, name)
        for field in fields:
            values = series[field]
            assert len(values) == 168 and None not in values, (name, field)
            assert sum(v != 0 for v in values) <= 1 and values.count(0) >= 167, (name, field)
        assert sum(series[fields[0]]) > 0  # type: ignore[arg-type]
    for name in ("errors", "latency"):
        for field, values in _plot(page, name).items():
            assert values.count(None) == 167 and len(values) == 168, (name, field)
