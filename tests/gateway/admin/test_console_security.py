"""The admin console's security, through HTTP: no page or fragment without a session, the
session cookie's flags, CSRF refused, the CSP on every answer, a user key refused, sign-in
rate-limited, sessions revocable, and no secret in any page."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from tests.support.console import ADMIN_KEY, ConsoleClient, ConsoleGateway

PAGES = (
    "/admin/ui/overview",
    "/admin/ui/keys",
    "/admin/ui/requests",
    "/admin/ui/usage",
    "/admin/ui/usage.csv",
    "/admin/ui/live",
)
CHANGES: tuple[tuple[str, dict[str, str]], ...] = (
    ("/admin/ui/keys", {"name": "x"}),
    ("/admin/ui/keys/key_x/revoke", {}),
    ("/admin/ui/keys/key_x/rotate", {}),
    ("/admin/ui/keys/key_x/disable", {"disabled": "1"}),
    ("/admin/ui/keys/key_x", {"name": "x"}),
    ("/admin/ui/logout", {}),
)


async def test_no_page_or_fragment_without_a_session(console_gateway: ConsoleGateway) -> None:
    client = console_gateway.client()
    try:
        for path in PAGES:
            status, headers, text, _ = await client.request("GET", path)
            assert status == 303 and headers["Location"].startswith("/admin/ui/login?next=")
            assert "<table" not in text
        status, _, text, _ = await client.request(
            "GET", "/admin/ui/live/state", headers={"X-Console-Fragment": "1"}
        )
        assert status == 401 and "Ready" not in text
        for path, data in CHANGES:
            status, _, _, _ = await client.request("POST", path, data=data)
            assert status == 401, path
        # A forged cookie is no session.
        client.session.cookie_jar.update_cookies({"gw_console": "forged"})
        status, _, _, _ = await client.request("GET", "/admin/ui/keys")
        assert status == 303
    finally:
        await client.close()


async def test_session_cookie_flags_and_headers(console_gateway: ConsoleGateway) -> None:
    client = console_gateway.client()
    try:
        status, headers, _, resp = await client.request(
            "POST", "/admin/ui/login", data={"admin_key": ADMIN_KEY, "next": "/admin/ui/keys"}
        )
        assert status == 303 and headers["Location"] == "/admin/ui/keys"
        cookie = resp.cookies["gw_console"]
        assert cookie["httponly"] and cookie["samesite"] == "Strict"
        assert cookie["path"] == "/admin/ui" and int(cookie["max-age"]) > 0
        assert not cookie["secure"]  # plain http here
        assert ADMIN_KEY not in cookie.value
        for path in (*PAGES, "/admin/ui/login"):
            status, headers, text, _ = await client.request("GET", path)
            assert status == 200, path
            csp = headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "style-src 'self'" in csp
            assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert ADMIN_KEY not in text
            assert "<script>" not in text and " style=" not in text
        # Behind a TLS proxy the cookie is Secure.
        status, _, _, resp = await client.request(
            "POST",
            "/admin/ui/login",
            data={"admin_key": ADMIN_KEY},
            headers={"X-Forwarded-Proto": "https"},
        )
        assert status == 303 and resp.cookies["gw_console"]["secure"]
    finally:
        await client.close()


async def test_csrf_is_refused(console: ConsoleClient, console_gateway: ConsoleGateway) -> None:
    status, _, text, _ = await console.request("POST", "/admin/ui/keys", data={"name": "no-token"})
    assert status == 403 and "token" in text
    status, _, _, _ = await console.request(
        "POST", "/admin/ui/keys", data={"name": "bad", "csrf": "guess"}
    )
    assert status == 403
    # The right token from another origin.
    status, _, _, _ = await console.request(
        "POST",
        "/admin/ui/keys",
        data={"name": "cross", "csrf": console.csrf},
        headers={"Origin": "https://evil.example"},
    )
    assert status == 403
    _, _, listing, _ = await console.request("GET", "/admin/ui/keys")
    assert "no-token" not in listing and "cross" not in listing
    _, status, _, text = await console.post_and_follow("/admin/ui/keys", {"name": "with-token"})
    assert status == 200 and "with-token" in text


async def test_a_user_key_gets_nothing(console_gateway: ConsoleGateway) -> None:
    client = console_gateway.client()
    try:
        assert await client.login(console_gateway.user_key) == 401
        status, _, _, _ = await client.request(
            "GET",
            "/admin/ui/keys",
            headers={"Authorization": f"Bearer {console_gateway.user_key}"},
        )
        assert status == 303
        status, _, _, _ = await client.request(
            "GET", "/admin/ui/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert status == 303  # the console signs in by form only, never by header
    finally:
        await client.close()


async def test_sign_in_is_rate_limited(console_gateway: ConsoleGateway) -> None:
    client = console_gateway.client()
    try:
        statuses = [await client.login("wrong") for _ in range(5)]
        assert statuses == [401] * 5
        status, headers, text, _ = await client.request(
            "POST", "/admin/ui/login", data={"admin_key": ADMIN_KEY}
        )
        assert status == 429 and int(headers["Retry-After"]) > 0
        assert "Too many" in text
    finally:
        await client.close()


async def test_sign_out_ends_the_session(console: ConsoleClient) -> None:
    other = ConsoleClient(console.root)
    try:
        assert await other.login() == 303
        status, headers, _ = await console.post("/admin/ui/logout", {})
        assert status == 303
        status, _, _, _ = await console.request("GET", "/admin/ui/keys")
        assert status == 303  # this browser is signed out ...
        assert (await other.request("GET", "/admin/ui/keys"))[0] == 200  # ... the other is not
        status, _, _ = await other.post("/admin/ui/logout", {"everywhere": "1"})
        assert status == 303
        assert (await other.request("GET", "/admin/ui/keys"))[0] == 303
    finally:
        await other.close()


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/v1/models"])
async def test_sign_in_only_returns_to_the_console(
    console_gateway: ConsoleGateway, target: str
) -> None:
    client = console_gateway.client()
    try:
        status, headers, _, _ = await client.request(
            "POST", "/admin/ui/login", data={"admin_key": ADMIN_KEY, "next": target}
        )
        assert status == 303 and headers["Location"] == "/admin/ui/"
    finally:
        await client.close()


async def test_redis_holds_no_token_and_the_session_expires(
    console_gateway: ConsoleGateway, redis: Redis, redis_prefix: str
) -> None:
    client = console_gateway.client()
    try:
        _, _, _, resp = await client.request(
            "POST", "/admin/ui/login", data={"admin_key": ADMIN_KEY}
        )
        token = resp.cookies["gw_console"].value
        [name] = [k async for k in redis.scan_iter(match=f"{redis_prefix}console:session:*")]
        assert token.encode() not in name
        stored = await redis.hgetall(name)
        dumped = b" ".join(
            part if isinstance(part, bytes) else part.encode()
            for part in (*stored.keys(), *stored.values())
        )
        assert token.encode() not in dumped and ADMIN_KEY.encode() not in dumped
        assert 0 < await redis.ttl(name) <= 8 * 3600
        await redis.delete(name)  # the server side ends it: the cookie is worth nothing
        assert (await client.request("GET", "/admin/ui/keys"))[0] == 303
    finally:
        await client.close()
