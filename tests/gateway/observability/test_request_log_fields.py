"""Every log line of a request carries its request id, key, model and provider (gateway/
log_context.py), and the next request on the same connection starts with none of them."""

from __future__ import annotations

import io
import json

import aiohttp
import structlog

from gateway.config.process import LoggingSettings
from gateway.observability.logging import configure_logging
from testkit.gateway_app import Gateway


def _request_lines(text: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "request"]


async def test_request_lines_carry_their_own_fields_only(gateway: Gateway) -> None:
    saved = structlog.get_config()
    logs = io.StringIO()
    configure_logging(LoggingSettings(format="json", level="info"), stream=logs)
    headers = {"Authorization": f"Bearer {gateway.key}"}
    body = {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with aiohttp.ClientSession() as session:  # one connection for all three
            async with session.post(
                f"{gateway.base_url}/chat/completions",
                json=body,
                headers={**headers, "x-request-id": "first-one"},
            ) as resp:
                assert resp.status == 200
                await resp.read()
            async with session.get(
                f"{gateway.root}/nowhere", headers={"x-request-id": "second-one"}
            ) as resp:
                assert resp.status == 404
            async with session.post(
                f"{gateway.base_url}/chat/completions",
                json={**body, "stream": True},
                headers={**headers, "x-request-id": "third-one"},
            ) as resp:
                assert resp.status == 200
                await resp.read()
    finally:
        structlog.configure(**saved)
    first, second, third = _request_lines(logs.getvalue())
    for line, rid in ((first, "first-one"), (third, "third-one")):
        assert line["request_id"] == rid and line["status"] == 200
        assert line["model"] == "echo-model" and line["provider"] == "mock"
        assert line["route_model"] == "echo" and isinstance(line["key_id"], str)
    assert second["request_id"] == "second-one" and second["status"] == 404
    assert not {"key_id", "model", "provider", "route_model"} & set(second)
