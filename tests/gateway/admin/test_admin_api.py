"""The /admin API mounted by `setup_admin` on a small app with the gateway's error middleware,
over the real Redis: auth, key CRUD, usage queries, and bad input changing nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from gateway.access.contract import Outcome, Ticket
from gateway.admin.api import setup_admin
from gateway.config.settings import Settings
from gateway.keys.redis_access import RedisAccessControl
from gateway.resources import REDIS
from gateway.server.middleware import error_middleware
from providers.types import Usage

ADMIN_KEY = "admin-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
async def prefix(redis: Redis) -> AsyncIterator[str]:
    prefix = f"test:{uuid.uuid4().hex}:"
    yield prefix
    keys = [key async for key in redis.scan_iter(match=prefix + "*")]
    if keys:
        await redis.delete(*keys)


async def admin_client(redis: Redis, prefix: str, admin_key: str | None) -> TestClient[Any, Any]:
    settings = Settings(
        admin={"api_key": admin_key}, redis={"key_prefix": prefix}, use_presets=False
    )
    app = web.Application(middlewares=[error_middleware])
    app[REDIS] = redis
    setup_admin(app, settings)
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
async def client(redis: Redis, prefix: str) -> AsyncIterator[TestClient[Any, Any]]:
    client = await admin_client(redis, prefix, ADMIN_KEY)
    yield client
    await client.close()


async def snapshot(redis: Redis, prefix: str) -> dict[bytes, Any]:
    """Every key under the prefix with its value."""
    out: dict[bytes, Any] = {}
    async for key in redis.scan_iter(match=prefix + "*"):
        kind = await redis.type(key)
        if kind == b"hash":
            out[key] = await redis.hgetall(key)
        elif kind == b"set":
            out[key] = await redis.smembers(key)
        elif kind == b"string":
            out[key] = await redis.get(key)
        else:
            out[key] = await redis.dump(key)
    return out


async def error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    body: dict[str, Any] = (await resp.json())["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return body


async def test_no_admin_key_means_403_for_everything(redis: Redis, prefix: str) -> None:
    client = await admin_client(redis, prefix, None)
    try:
        for method, path in (("GET", "/admin/keys"), ("POST", "/admin/keys"),
                             ("GET", "/admin/usage"), ("DELETE", "/admin/keys/x"),
                             ("GET", "/admin/unknown")):  # fmt: skip
            resp = await client.request(method, path, headers={"Authorization": "Bearer "})
            assert (await error(resp, 403))["code"] == "admin_disabled"
    finally:
        await client.close()
    assert await snapshot(redis, prefix) == {}


async def test_wrong_or_missing_admin_key_is_401(client: TestClient[Any, Any]) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_KEY}):
        resp = await client.get("/admin/keys", headers=headers)
        await error(resp, 401)


async def test_key_crud(client: TestClient[Any, Any], redis: Redis, prefix: str) -> None:
    body = {"name": "ci", "models": ["m"], "budget_tokens": 100, "budget_period": "day",
            "budget_cost": 2.5, "budget_cost_period": "month",
            "rpm": 1, "tpm": 2, "max_concurrency": 3,
            "expires_at": "2099-01-01T00:00:00+01:00", "metadata": {"team": "x"}}  # fmt: skip
    resp = await client.post("/admin/keys", json=body, headers=AUTH)
    assert resp.status == 201
    created = await resp.json()
    secret, key_id = created.pop("key"), created["id"]
    assert secret.startswith("sk-") and created["expires_at"] == "2098-12-31T23:00:00Z"
    assert {k: created[k] for k in body if k != "expires_at"} == {
        k: v for k, v in body.items() if k != "expires_at"
    }
    assert created["disabled"] is False and created["hint"] == secret[-4:]

    listed = await (await client.get("/admin/keys", headers=AUTH)).json()
    assert listed == {"object": "list", "data": [created]}
    shown = await (await client.get(f"/admin/keys/{key_id}", headers=AUTH)).json()
    assert shown == created

    patch = {"rpm": None, "name": "renamed", "disabled": True}
    resp = await client.patch(f"/admin/keys/{key_id}", json=patch, headers=AUTH)
    patched = await resp.json()
    assert resp.status == 200
    assert (patched["rpm"], patched["name"], patched["disabled"], patched["tpm"]) == (
        None, "renamed", True, 2,
    )  # fmt: skip

    resp = await client.post(f"/admin/keys/{key_id}/rotate", headers=AUTH)
    rotated = await resp.json()
    assert rotated["key"] != secret and rotated["id"] == key_id

    everything = json.dumps([str(v) for v in (await snapshot(redis, prefix)).values()])
    assert secret not in everything and rotated["key"] not in everything

    resp = await client.delete(f"/admin/keys/{key_id}", headers=AUTH)
    assert await resp.json() == {"id": key_id, "object": "api_key", "deleted": True}
    for method, path in (("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/rotate")):
        resp = await client.request(
            method, f"/admin/keys/{key_id}{path}", json={"rpm": 1}, headers=AUTH
        )
        assert (await error(resp, 404))["code"] == "not_found"


BAD_CREATES = [
    (b"{", None),
    (b"[]", None),
    (b'"name"', None),
    (b'{"name": 5}', "name"),
    (b'{"name": "  "}', "name"),
    (json.dumps({"name": "x" * 10_000}).encode(), "name"),
    (b"{}", "name"),
    (b'{"name": "a", "rpm": -1}', "rpm"),
    (b'{"name": "a", "tpm": "10"}', "tpm"),
    (b'{"name": "a", "max_concurrency": 1.5}', "max_concurrency"),
    (b'{"name": "a", "budget_tokens": true}', "budget_tokens"),
    (b'{"name": "a", "budget_tokens": 5, "budget_period": "week"}', "budget_period"),
    (b'{"name": "a", "budget_period": "day"}', "budget_period"),
    (b'{"name": "a", "budget_cost": -1}', "budget_cost"),
    (b'{"name": "a", "budget_cost": "5"}', "budget_cost"),
    (b'{"name": "a", "budget_cost": 1e12}', "budget_cost"),
    (b'{"name": "a", "budget_cost_period": "day"}', "budget_cost_period"),
    (b'{"name": "a", "budget_cost": 1, "budget_cost_period": "week"}', "budget_cost_period"),
    (b'{"name": "a", "models": "gpt"}', "models"),
    (b'{"name": "a", "models": [""]}', "models.0"),
    (b'{"name": "a", "metadata": {"k": 1}}', "metadata.k"),
    (b'{"name": "a", "expires_at": "soon"}', "expires_at"),
    (b'{"name": "a", "expires_at": "2001-01-01T00:00:00Z"}', "expires_at"),
    (b'{"name": "a", "key": "sk-mine"}', "key"),
    (b'{"name": "a", "id": "key_x"}', "id"),
]


@pytest.mark.parametrize(("body", "param"), BAD_CREATES)
async def test_bad_create_is_400_naming_the_field_and_changes_nothing(
    client: TestClient[Any, Any], redis: Redis, prefix: str, body: bytes, param: str | None
) -> None:
    resp = await client.post("/admin/keys", data=body, headers=AUTH)
    err = await error(resp, 400)
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert await snapshot(redis, prefix) == {}


async def test_bad_patches_change_nothing(
    client: TestClient[Any, Any], redis: Redis, prefix: str
) -> None:
    resp = await client.post("/admin/keys", json={"name": "a", "rpm": 5}, headers=AUTH)
    key_id = (await resp.json())["id"]
    before = await snapshot(redis, prefix)
    for body, param in (
        (b'{"bogus": 1}', "bogus"),
        (b'{"rpm": -5}', "rpm"),
        (b'{"rpm": "5"}', "rpm"),
        (b'{"disabled": "yes"}', "disabled"),
        (b'{"budget_period": "day"}', "budget_period"),
        (b'{"expires_at": "2001-01-01T00:00:00Z"}', "expires_at"),
        (b'{"created": "2001-01-01T00:00:00Z"}', "created"),
        (b'{"hint": "abcd"}', "hint"),
        (b'{"name": null}', "name"),
        (b'{"disabled": null}', "disabled"),
        (b"not json", None),
        (b"null", None),
    ):
        resp = await client.patch(f"/admin/keys/{key_id}", data=body, headers=AUTH)
        assert (await error(resp, 400))["param"] == param, body
    assert await snapshot(redis, prefix) == before


async def test_huge_body_is_refused(
    client: TestClient[Any, Any], redis: Redis, prefix: str
) -> None:
    body = json.dumps({"name": "a", "metadata": {"k": "v" * 200_000}}).encode()
    resp = await client.post("/admin/keys", data=body, headers=AUTH)
    assert (await error(resp, 413))["code"] == "payload_too_large"
    assert await snapshot(redis, prefix) == {}


async def test_usage_query(client: TestClient[Any, Any], redis: Redis, prefix: str) -> None:
    resp = await client.post("/admin/keys", json={"name": "u"}, headers=AUTH)
    created = await resp.json()
    access = RedisAccessControl(redis, prefix=prefix, usage_stream_maxlen=10)
    principal = await access.authenticate(created["key"])
    for model in ("a", "b", "b"):
        grant = await access.admit(Ticket(principal, model, "req", 4, 10))
        await access.settle(grant, Outcome(Usage(4, 6, reasoning_tokens=2), 200))
    await access.aclose()
    resp = await client.get(
        "/admin/usage",
        params={"key_id": created["id"], "group_by": "model", "start": "2020-01-01", "end": ""},
        headers=AUTH,
    )
    report = await resp.json()
    assert resp.status == 200 and report["start"] == "2020-01-01" and report["end"] is None
    assert report["totals"] == {"requests": 3, "prompt_tokens": 12, "completion_tokens": 18,
                                "reasoning_tokens": 6, "cached_tokens": 0, "errors": 0}  # fmt: skip
    assert [(r["model"], r["requests"]) for r in report["data"]] == [("a", 1), ("b", 2)]
    for params, param in (
        ({"group_by": "week"}, "group_by"),
        ({"start": "yesterday"}, "start"),
        ({"start": "2026-02-02", "end": "2026-02-01"}, "start"),
        ({"bogus": "1"}, "bogus"),
    ):
        resp = await client.get("/admin/usage", params=params, headers=AUTH)
        assert (await error(resp, 400))["param"] == param
