"""The API's OpenAPI 3.1 document, generated from the pydantic models the handlers parse with,
served at `GET /openapi.json` (no key needed: it holds no secret).

Request bodies are the wire models themselves (unknown fields are accepted, as the handlers
accept them); answers are described by status: JSON or SSE on success, the OpenAI error object
otherwise. Routes are also served without the `/v1` prefix; the document lists the `/v1` ones.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway.keys.records import KeyCreate, KeyUpdate, UsageQuery
from gateway.usage_store.queries import ExportQuery, RecordsQuery, SummaryQuery
from gateway.wire.chat_request import ChatBody, CompletionBody
from gateway.wire.responses_request import ResponsesBody

_REF = "#/components/schemas/{model}"
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_BODIES: tuple[type[BaseModel], ...] = (
    ChatBody,
    CompletionBody,
    ResponsesBody,
    KeyCreate,
    KeyUpdate,
)
_API_KEY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]
_ADMIN: list[dict[str, list[str]]] = [{"adminBearer": []}]


def _answers(success: str, *, stream: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    error = {
        "description": "An error, in OpenAI's shape",
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}},
    }
    return {success: {"description": "Success", "content": content}, "4XX": error, "5XX": error}


def _body(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(model: type[BaseModel]) -> list[dict[str, Any]]:
    properties = model.model_json_schema(ref_template=_REF)["properties"]
    return [
        {"name": name, "in": "query", "required": False, "schema": schema}
        for name, schema in properties.items()
    ]


def _operation(
    summary: str,
    success: str = "200",
    *,
    body: type[BaseModel] | None = None,
    security: list[dict[str, list[str]]] | None = None,
    stream: bool = False,
    parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": _answers(success, stream=stream)}
    if body is not None:
        operation["requestBody"] = _body(body)
    operation["security"] = security if security is not None else []
    if parameters:
        operation["parameters"] = parameters
    return operation


def _usage_store_paths(key_id: list[dict[str, Any]]) -> dict[str, Any]:
    """The usage store's reports (404 `usage_store_disabled` without `[usage] enabled`)."""
    export = _operation(
        "Usage records as CSV, oldest first (streamed)",
        security=_ADMIN,
        parameters=_query(ExportQuery),
    )
    export["responses"]["200"]["content"] = {"text/csv": {"schema": {"type": "string"}}}
    summary = _query(SummaryQuery)
    return {
        "/admin/usage/summary": {
            "get": _operation(
                "Usage totals by key, model, provider, route, thinking, status or error code; "
                "per hour, day or month",
                security=_ADMIN,
                parameters=summary,
            )
        },
        "/admin/usage/records": {
            "get": _operation(
                "Usage records, newest first, paged (metadata only)",
                security=_ADMIN,
                parameters=_query(RecordsQuery),
            )
        },
        "/admin/usage/export": {"get": export},
        "/admin/keys/{id}/usage": {
            "get": _operation(
                "One key's usage totals",
                security=_ADMIN,
                parameters=key_id + [p for p in summary if p["name"] != "key"],
            )
        },
    }


def build_openapi() -> dict[str, Any]:
    _, defs = models_json_schema([(m, "validation") for m in _BODIES], ref_template=_REF)
    schemas = {**defs["$defs"], "Error": _ERROR}
    key_id = [_path_param("id")]
    paths: dict[str, Any] = {
        "/v1/chat/completions": {
            "post": _operation("Chat completion", body=ChatBody, security=_API_KEY, stream=True)
        },
        "/v1/completions": {
            "post": _operation("Completion", body=CompletionBody, security=_API_KEY, stream=True)
        },
        "/v1/beta/completions": {
            "post": _operation(
                "Fill in the middle (DeepSeek's FIM endpoint: prompt + suffix; also the same as "
                "/v1/completions)",
                body=CompletionBody,
                security=_API_KEY,
                stream=True,
            )
        },
        "/v1/responses": {
            "post": _operation("Response", body=ResponsesBody, security=_API_KEY, stream=True)
        },
        "/v1/models": {"get": _operation("List models", security=_API_KEY)},
        "/v1/models/{model}": {
            "get": _operation("One model", security=_API_KEY, parameters=[_path_param("model")])
        },
        "/healthz": {"get": _operation("Liveness")},
        "/readyz": {
            "get": _operation(
                "Readiness: 503 while Redis is away, a local engine is loading or down, or the "
                "process drains; models down are named in the body"
            )
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "security": [],
                "responses": {"200": {"description": "Prometheus text format"}},
            }
        },
        "/admin/keys": {
            "post": _operation("Create an API key", "201", body=KeyCreate, security=_ADMIN),
            "get": _operation("List API keys", security=_ADMIN),
        },
        "/admin/keys/{id}": {
            "get": _operation("One API key", security=_ADMIN, parameters=key_id),
            "patch": _operation(
                "Change an API key", body=KeyUpdate, security=_ADMIN, parameters=key_id
            ),
            "delete": _operation("Revoke an API key", security=_ADMIN, parameters=key_id),
        },
        "/admin/keys/{id}/rotate": {
            "post": _operation("Rotate an API key's secret", security=_ADMIN, parameters=key_id)
        },
        "/admin/usage": {
            "get": _operation("Usage totals", security=_ADMIN, parameters=_query(UsageQuery))
        },
        **_usage_store_paths(key_id),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "deepseek-gateway", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
                "adminBearer": {"type": "http", "scheme": "bearer"},
            },
        },
    }


def setup_openapi(app: web.Application) -> None:
    """Serve the document at GET /openapi.json (built once, here)."""
    document = build_openapi()

    async def openapi(_: web.Request) -> web.Response:
        return web.json_response(document)

    app.router.add_get("/openapi.json", openapi)
