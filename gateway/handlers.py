"""HTTP handlers: parse, call a service, shape the response. Nothing else lives here."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.access.contract import Principal
from gateway.cluster.membership import cluster_detail
from gateway.errors import AuthenticationError, InvalidRequest
from gateway.resources import (
    ACCESS,
    BREAKERS,
    CLUSTER,
    METRICS,
    PIPELINE,
    ROUTER,
    SETTINGS,
    SIGNER,
    WORKER,
)
from gateway.server.middleware import REQUEST_ID
from gateway.server.readiness import app_readiness, export
from gateway.server.request_body import read_body
from gateway.wire.chat_request import parse_chat, parse_completion
from gateway.wire.chat_response import ChatWire
from gateway.wire.completion_response import CompletionWire
from gateway.wire.messages_request import parse_count_tokens, parse_messages
from gateway.wire.messages_response import MessagesWire
from gateway.wire.messages_tokens import count_message_tokens
from gateway.wire.responses_request import parse_responses
from gateway.wire.responses_response import ResponsesWire
from plumbing import jsoncodec
from providers.base import ModelCard


async def authenticate(request: web.Request) -> Principal:
    if not request.app[SETTINGS].auth.enabled:
        return await request.app[ACCESS].authenticate(None)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        token = request.headers.get("x-api-key", "")
    if not token.strip():
        raise AuthenticationError(
            "Missing API key. Send it as 'Authorization: Bearer <key>'.", code="missing_api_key"
        )
    return await request.app[ACCESS].authenticate(token.strip())


async def read_json(request: web.Request) -> Any:
    raw = await read_body(request, request.app[SETTINGS].server.request_body_timeout_s)
    try:
        return jsoncodec.loads(raw)
    except jsoncodec.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    principal = await authenticate(request)
    body, chat = parse_chat(await read_json(request), request[REQUEST_ID])
    wire = ChatWire(include_usage=bool(body.stream_options and body.stream_options.include_usage))
    return await request.app[PIPELINE].serve(request, principal, chat, wire)


async def completions(request: web.Request) -> web.StreamResponse:
    principal = await authenticate(request)
    body, chat = parse_completion(await read_json(request), request[REQUEST_ID])
    wire = CompletionWire(
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        echo=chat.prompt or "" if body.echo else "",
    )
    return await request.app[PIPELINE].serve(request, principal, chat, wire)


async def responses(request: web.Request) -> web.StreamResponse:
    principal = await authenticate(request)
    parsed = parse_responses(await read_json(request), request[REQUEST_ID])
    wire = ResponsesWire(parsed.echo, parsed.tool_names)
    return await request.app[PIPELINE].serve(request, principal, parsed.chat, wire)


async def messages(request: web.Request) -> web.StreamResponse:
    principal = await authenticate(request)
    signer = request.app[SIGNER]
    key_id = principal.key_id
    chat = parse_messages(
        await read_json(request),
        request[REQUEST_ID],
        lambda text, signature: signer.verify(key_id, text, signature),
    )
    wire = MessagesWire(chat.model, lambda text: signer.sign(key_id, text))
    return await request.app[PIPELINE].serve(request, principal, chat, wire)


async def count_tokens(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    signer = request.app[SIGNER]
    chat = parse_count_tokens(
        await read_json(request),
        request[REQUEST_ID],
        lambda text, signature: signer.verify(principal.key_id, text, signature),
    )
    tokens = await count_message_tokens(request.app[ROUTER], principal, chat)
    return web.json_response({"input_tokens": tokens})


def _card(card: ModelCard) -> dict[str, Any]:
    return {"id": card.id, "object": "model", "created": card.created, "owned_by": card.owned_by}


async def list_models(request: web.Request) -> web.Response:
    await authenticate(request)
    cards = request.app[ROUTER].cards()
    return web.json_response({"object": "list", "data": [_card(c) for c in cards]})


async def get_model(request: web.Request) -> web.Response:
    await authenticate(request)
    return web.json_response(_card(request.app[ROUTER].card(request.match_info["model"])))


async def root(request: web.Request) -> web.Response:
    """`GET /` and `HEAD /`: Claude Code probes its base URL before the first request. A
    browser (asking for HTML) goes to the admin console when it is served."""
    admin = request.app[SETTINGS].admin
    wants_html = "text/html" in request.headers.get("Accept", "")
    if wants_html and admin.console and admin.api_key is not None:
        raise web.HTTPFound(location="/admin/ui/")
    return web.json_response({"status": "ok"})


async def healthz(request: web.Request) -> web.Response:
    """Liveness, and which serving process answered (`server.workers`)."""
    return web.json_response({"status": "ok", "worker": request.app[WORKER]})


async def readyz(request: web.Request) -> web.Response:
    """Whether this process can serve (gateway/server/readiness.py): no upstream is called."""
    ready, body = await _readiness(request)
    cluster = request.app.get(CLUSTER)
    if cluster is not None:  # the peers this node sees: detail, not readiness
        body["cluster"] = cluster_detail(cluster)
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    m = request.app[METRICS]
    ready, state = await _readiness(request)
    export(m, request.app[BREAKERS], request.app[ROUTER].providers, ready, state)
    return web.Response(body=m.render(), content_type="text/plain", charset="utf-8")


async def _readiness(request: web.Request) -> tuple[bool, dict[str, Any]]:
    return await app_readiness(request.app)


def routes() -> list[web.RouteDef]:
    table: list[web.RouteDef] = []
    for prefix in ("/v1", ""):
        table += [
            web.post(f"{prefix}/chat/completions", chat_completions),
            web.post(f"{prefix}/completions", completions),
            # DeepSeek's fill-in-the-middle endpoint (the same body): Continue's DeepSeek
            # provider and the openai SDK with base_url ".../beta" post here.
            web.post(f"{prefix}/beta/completions", completions),
            web.post(f"{prefix}/responses", responses),
            web.post(f"{prefix}/messages", messages),
            web.post(f"{prefix}/messages/count_tokens", count_tokens),
            web.get(f"{prefix}/models", list_models),
            web.get(f"{prefix}/models/{{model:.+}}", get_model),
        ]
    table += [
        web.get("/", root),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/metrics", metrics),
    ]
    return table
