"""Post/redirect/get and the console's answers, through HTTP as a browser sends them: every
change answers 303 to a GET page and a reload of that page repeats nothing (no second key, no
second rotation, a secret shown once); every answer under /admin/ui, redirects, refusals and
pages that do not exist included, carries the CSP, nosniff and no-store."""

from __future__ import annotations

import re

import openai
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from tests.support.console import ConsoleClient, ConsoleGateway

SECRET = re.compile(r'<code id="secret">([^<]+)</code>')


def assert_console_headers(path: str, status: int, headers: dict[str, str]) -> None:
    csp = headers.get("Content-Security-Policy", "")
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, (path, status)
    assert headers.get("X-Content-Type-Options") == "nosniff", (path, status)
    if "/static/" in path:
        assert "immutable" in headers["Cache-Control"], path
    else:
        assert headers.get("Cache-Control") == "no-store", (path, status)


async def _keys(redis: Redis, prefix: str) -> list[str]:
    return sorted(r.name for r in await KeyStore(redis, prefix=prefix).list())


async def test_a_reload_after_every_post_repeats_nothing(
    console: ConsoleClient, console_gateway: ConsoleGateway, redis: Redis, redis_prefix: str
) -> None:
    before = await _keys(redis, redis_prefix)
    # Create: the secret is on the page the POST sent to, once.
    created, status, headers, page = await console.post_and_follow(
        "/admin/ui/keys", {"name": "prg-key"}
    )
    found = SECRET.search(page)
    assert status == 200 and found and "Key created" in page
    secret = found.group(1)
    key_id = created.split("/")[4]
    reload_status, reload_headers, again, _ = await console.request("GET", created)
    assert reload_status == 200 and secret not in again and "cannot be shown again" in again
    assert_console_headers(created, reload_status, reload_headers)
    assert await _keys(redis, redis_prefix) == sorted([*before, "prg-key"])  # one key, not two
    assert secret not in created  # never in the URL

    # Rotate: the new secret once; a reload neither shows it again nor rotates again.
    rotated, status, _, page = await console.post_and_follow(f"/admin/ui/keys/{key_id}/rotate", {})
    found = SECRET.search(page)
    assert status == 200 and found and "Key rotated" in page
    new_secret = found.group(1)
    assert (await console.request("GET", rotated))[2].count(new_secret) == 0
    client = openai.AsyncOpenAI(base_url=f"{console.root}/v1", api_key=new_secret, max_retries=0)
    try:  # the secret just copied still works after the reload
        await client.chat.completions.create(
            model="echo-model", messages=[{"role": "user", "content": "after a reload"}]
        )
    finally:
        await client.close()

    # Another session cannot take this session's hand-off.
    other = console_gateway.client()
    try:
        assert await other.login() == 303
        _, status, _, _ = await console.post_and_follow(f"/admin/ui/keys/{key_id}/rotate", {})
        _, _, theirs, _ = await other.request("GET", f"/admin/ui/keys/{key_id}/secret")
        assert SECRET.search(theirs) is None
    finally:
        await other.close()

    # Edit, disable, a refused form, revoke: each a 303 to a GET page; reloading that page is
    # a GET that changes nothing.
    for path, data, then in (
        (f"/admin/ui/keys/{key_id}", {"name": "prg-key", "rpm": "7"}, "Saved."),
        (f"/admin/ui/keys/{key_id}/disable", {"disabled": "1"}, "disabled"),
        (f"/admin/ui/keys/{key_id}", {"name": "prg-key", "rpm": "-1"}, "rpm"),
        ("/admin/ui/keys", {"name": ""}, "name"),
        (f"/admin/ui/keys/{key_id}/revoke", {}, "was revoked"),
    ):
        location, status, headers, page = await console.post_and_follow(path, data)
        assert status == 200 and then in page, (path, data)
        assert_console_headers(location, status, headers)
        reload_status, reload_headers, _, _ = await console.request("GET", location)
        assert reload_status == 200
        assert_console_headers(location, reload_status, reload_headers)
    assert await _keys(redis, redis_prefix) == before
    gone = await KeyStore(redis, prefix=redis_prefix).revoked(key_id)
    assert gone is not None and gone.record.rpm == 7 and gone.record.disabled

    # Sign out: a 303 to the sign-in page; reloading it signs nobody in.
    location, status, headers, _ = await console.post_and_follow("/admin/ui/logout", {})
    assert location == "/admin/ui/login" and status == 200
    assert (await console.request("GET", "/admin/ui/keys"))[0] == 303


async def test_every_console_answer_carries_the_headers(
    console: ConsoleClient, console_gateway: ConsoleGateway, redis: Redis, redis_prefix: str
) -> None:
    store = KeyStore(redis, prefix=redis_prefix)
    _, revoked = await store.create(KeyCreate(name="gone-key"))
    await store.revoke(revoked.id)
    status, _, keys_page, _ = await console.request("GET", "/admin/ui/keys")
    static = re.findall(r'(?:href|src)="(/admin/ui/static/[^"]+)"', keys_page)
    assert len(static) == 4
    signed_in = {
        "/admin/ui": (303, "/admin/ui/"),
        "/admin/ui/": (303, "/admin/ui/overview"),
        "/admin/ui/no/such/page": (404, "No such page"),
        "/admin/ui/keys/key_nothing": (404, "No such key"),
        f"/admin/ui/keys/{revoked.id}": (410, "This key was revoked on "),
        f"/admin/ui/keys/{revoked.id}/secret": (410, "This key was revoked on "),
        "/admin/ui/overview?range=9y": (400, "Unknown range"),
        "/admin/ui/login": (200, "Admin key"),
        **{path: (200, "") for path in static},
    }
    for path, (want, says) in signed_in.items():
        status, headers, text, _ = await console.request("GET", path)
        assert status == want, (path, status)
        assert says in (headers.get("Location", "") if status == 303 else text), path
        assert_console_headers(path, status, headers)
    status, headers, text, _ = await console.request(
        "POST", "/admin/ui/no/such/page", data={"csrf": console.csrf}
    )
    assert status == 404 and "No such page" in text
    assert_console_headers("POST /admin/ui/no/such/page", status, headers)
    status, headers, _, _ = await console.request("POST", "/admin/ui/keys", data={"name": "x"})
    assert status == 403
    assert_console_headers("POST without a token", status, headers)

    stranger = console_gateway.client()
    try:
        for path, want in (
            ("/admin/ui", 303),
            ("/admin/ui/no/such/page", 303),
            (f"/admin/ui/keys/{revoked.id}", 303),
        ):
            status, headers, text, _ = await stranger.request("GET", path)
            assert status == want, path
            assert "revoked" not in text and "No such" not in text
            assert_console_headers(path, status, headers)
        status, headers, _, _ = await stranger.request(
            "GET", "/admin/ui/live/state", headers={"X-Console-Fragment": "1"}
        )
        assert status == 401
        assert_console_headers("fragment", status, headers)
        status, headers, _, _ = await stranger.request(
            "POST", "/admin/ui/login", data={"admin_key": "wrong"}
        )
        assert status == 401
        assert_console_headers("refused sign-in", status, headers)
    finally:
        await stranger.close()
