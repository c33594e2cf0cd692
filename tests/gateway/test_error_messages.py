"""A provider's failure is told in the user's terms: what happened, naming the provider once,
with no library internals (those go to the logs). Through the real app in front of the mock
upstream (see testkit/gateway_app.py for the providers `mock`, `impatient`, `refused`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import structlog

from testkit.gateway_app import Gateway
from tests.support.sse_rules import sse_payloads

USER = [{"role": "user", "content": "alpha beta gamma delta epsilon"}]


def plain(message: str, provider: str) -> None:
    """One sentence naming the provider once, without a Python repr or an exception name."""
    assert message.count(f"'{provider}'") == 1, message
    assert message.lower().count("provider") == 1, message
    for internal in ("<", "Error", "Exception", "payload", "ssl:", "errno", "Traceback"):
        assert internal not in message, message


@pytest.mark.parametrize(
    ("model", "status", "message"),
    [
        ("mock/fail-500", 502, "Provider 'mock' failed with HTTP 500: mock failure 500"),
        ("mock/fail-503", 502, "Provider 'mock' failed with HTTP 503: mock failure 503"),
        (
            "mock/fail-429",
            429,
            "Provider 'mock' is rate limiting the gateway: mock failure 429",
        ),
        (
            "mock/fail-404",
            400,
            "Provider 'mock' rejected the request: mock failure 404",
        ),
        ("refused/echo", 502, "Provider 'refused' could not be reached."),
        (
            "impatient/hang",
            504,
            "Provider 'impatient' did not start its answer within 0.3 s (first byte timeout).",
        ),
        (
            "hasty/hang",
            504,
            "Provider 'hasty' did not complete its answer within 0.3 s (answer timeout).",
        ),
    ],
)
async def test_failures_before_the_answer(
    gateway: Gateway, model: str, status: int, message: str
) -> None:
    raw = await gateway.post_raw({"model": model, "messages": USER})
    assert raw.status == status
    error = json.loads(raw.body)["error"]
    assert error["message"] == message
    plain(error["message"], model.split("/")[0])


async def test_credentials_refused_upstream_is_the_operators_problem(gateway: Gateway) -> None:
    raw = await gateway.post_raw({"model": "mock/fail-401", "messages": USER})
    assert raw.status == 502
    error = json.loads(raw.body)["error"]
    assert error["code"] == "upstream_auth_failed"
    assert "operator" in error["message"]
    plain(error["message"], "mock")


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("mock/die-midstream-after-2", "Provider 'mock' broke off its answer before the end."),
        (
            "mock/error-midstream",
            "Provider 'mock' reported an error while answering: mock midstream failure",
        ),
        (
            "impatient/stall-after-1",
            "Provider 'impatient' sent no data for 0.3 s in the middle of its answer "
            "(idle timeout; keep-alive comments do not count).",
        ),
    ],
)
async def test_failures_mid_stream(gateway: Gateway, model: str, message: str) -> None:
    body: dict[str, Any] = {"model": model, "messages": USER, "stream": True}
    payloads = sse_payloads((await gateway.post_raw(body)).body)
    error = json.loads(payloads[-1])["error"]
    assert error["message"] == message
    plain(error["message"], model.split("/")[0])
    raw = await gateway.post_raw({**body, "input": "hi"}, path="/v1/responses")
    failed = json.loads(raw.body.decode().rsplit("data: ", 1)[1])
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["message"] == message


async def test_the_details_stay_in_the_logs(gateway: Gateway) -> None:
    body = {"model": "mock/die-midstream-after-2", "messages": USER, "stream": True}
    with structlog.testing.capture_logs() as logs:
        await gateway.post_raw(body)
    (failed,) = [entry for entry in logs if entry["event"] == "stream_failed"]
    assert "Http1Error" in failed["detail"]  # the transport's words, for the operator
