"""The admin HTTP API under /admin: API keys and usage.

Authenticated with `Authorization: Bearer <admin key>` (settings.admin.api_key, from
`GATEWAY_ADMIN__API_KEY`); with no admin key configured every /admin request is 403. A key's
secret appears only in the answers to create and rotate. Errors are raised as
`gateway.errors` exceptions for the app's error middleware to render.
"""

from __future__ import annotations

import hmac
from typing import Any, TypeVar

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from pydantic import BaseModel, SecretStr, ValidationError

from gateway.config.settings import Settings
from gateway.errors import AuthenticationError, InvalidRequest, PayloadTooLarge, PermissionDenied
from gateway.keys.records import KeyCreate, KeyRecord, KeyUpdate, UsageQuery
from gateway.keys.store import KeyStore
from gateway.keys.usage import UsageReader
from gateway.resources import REDIS
from gateway.server.request_body import read_body
from gateway.usage_store import admin as usage_store_admin
from gateway.usage_store.query_errors import query_error

log = structlog.get_logger("gateway.admin")

STORE = web.AppKey("admin_key_store", KeyStore)
USAGE = web.AppKey("admin_usage_reader", UsageReader)
BODY_TIMEOUT_S = web.AppKey("admin_body_timeout_s", float)
MAX_BODY_BYTES = 64 * 1024

Body = TypeVar("Body", bound=BaseModel)


def setup_admin(app: web.Application, settings: Settings) -> None:
    """Mount the admin API on `app` at /admin. Its store and usage reader are built on startup
    from the app's Redis (`REDIS`, opened in the app's cleanup_ctx, which runs first)."""
    admin = web.Application(middlewares=[_authorize(settings.admin.api_key)])
    admin[BODY_TIMEOUT_S] = settings.server.request_body_timeout_s
    if settings.admin.api_key is None:
        log.warning(
            "admin_api_disabled",
            how="set GATEWAY_ADMIN__API_KEY (with docker compose: in .env, see .env.example)",
        )
    prefix = settings.redis.key_prefix

    async def open_services(_: web.Application) -> None:
        admin[STORE] = KeyStore(app[REDIS], prefix=prefix)
        admin[USAGE] = UsageReader(app[REDIS], prefix=prefix)

    admin.on_startup.append(open_services)
    admin.add_routes(
        [
            web.post("/keys", create_key),
            web.get("/keys", list_keys),
            web.get("/keys/{id}", get_key),
            web.patch("/keys/{id}", update_key),
            web.delete("/keys/{id}", revoke_key),
            web.post("/keys/{id}/rotate", rotate_key),
            web.get("/keys/{id}/usage", key_usage),
            web.get("/usage", usage),
            *usage_store_admin.routes(),
        ]
    )
    app.add_subapp("/admin", admin)


def _authorize(admin_key: SecretStr | None) -> Middleware:
    expected = None if admin_key is None else admin_key.get_secret_value().encode()

    @web.middleware
    async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not expected:
            raise PermissionDenied(
                "The admin API is disabled: set GATEWAY_ADMIN__API_KEY to enable it.",
                code="admin_disabled",
            )
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        presented = token.strip().encode("utf-8", "surrogateescape")  # any bytes the client sent
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented, expected):
            raise AuthenticationError("Invalid admin key.", code="invalid_admin_key")
        return await handler(request)

    return authorize


def _public(record: KeyRecord) -> dict[str, Any]:
    return {"object": "api_key", **record.public()}


def _invalid(exc: ValidationError) -> InvalidRequest:
    """The first validation error as a 400 naming its field."""
    error = exc.errors(include_url=False)[0]
    field = ".".join(str(part) for part in error["loc"]) or None
    if error["type"] == "extra_forbidden":
        return InvalidRequest(f"Unknown field '{field}'.", param=field)
    if field is None:
        return InvalidRequest(f"The body must be a JSON object: {error['msg']}.")
    return InvalidRequest(f"Invalid value for '{field}': {error['msg']}.", param=field)


async def _parse(request: web.Request, model: type[Body]) -> Body:
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"The body is larger than {MAX_BODY_BYTES} bytes.")
    raw = await read_body(request, request.app[BODY_TIMEOUT_S])
    if len(raw) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"The body is larger than {MAX_BODY_BYTES} bytes.")
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise _invalid(exc) from None


async def create_key(request: web.Request) -> web.Response:
    body = await _parse(request, KeyCreate)
    secret, record = await request.app[STORE].create(body)
    log.info("api_key_created", key_id=record.id, name=record.name)
    return web.json_response({"id": record.id, "key": secret, **_public(record)}, status=201)


async def list_keys(request: web.Request) -> web.Response:
    records = await request.app[STORE].list()
    return web.json_response({"object": "list", "data": [_public(r) for r in records]})


async def get_key(request: web.Request) -> web.Response:
    return web.json_response(_public(await request.app[STORE].get(request.match_info["id"])))


async def update_key(request: web.Request) -> web.Response:
    patch = await _parse(request, KeyUpdate)
    try:
        record = await request.app[STORE].update(request.match_info["id"], patch)
    except ValidationError as exc:
        raise _invalid(exc) from None
    log.info("api_key_updated", key_id=record.id, fields=sorted(patch.model_fields_set))
    return web.json_response(_public(record))


async def revoke_key(request: web.Request) -> web.Response:
    key_id = request.match_info["id"]
    await request.app[STORE].revoke(key_id)
    log.info("api_key_revoked", key_id=key_id)
    return web.json_response({"id": key_id, "object": "api_key", "deleted": True})


async def rotate_key(request: web.Request) -> web.Response:
    secret, record = await request.app[STORE].rotate(request.match_info["id"])
    log.info("api_key_rotated", key_id=record.id)
    return web.json_response({"id": record.id, "key": secret, **_public(record)})


async def usage(request: web.Request) -> web.Response:
    params = {name: value for name, value in request.query.items() if value}
    try:
        query = UsageQuery.model_validate(params)
    except ValidationError as exc:
        raise query_error(UsageQuery, exc) from None
    if query.start and query.end and query.start.date() > query.end.date():
        raise InvalidRequest("'start' is after 'end'.", param="start")
    return web.json_response(await request.app[USAGE].query(query))


async def key_usage(request: web.Request) -> web.Response:
    """The key's own usage from the usage store (GET /admin/usage/summary's parameters)."""
    key_id = request.match_info["id"]
    await request.app[STORE].get(key_id)  # 404 for a key that does not exist
    if "key" in request.query:
        raise InvalidRequest("'key' is fixed by the path.", param="key")
    return await usage_store_admin.summary_response(request, key=key_id)
