"""Fill in the middle through upstream routes, against the mock upstream: each provider receives
the request in the form its `fim` setting names (DeepSeek's /beta/completions, or `suffix` on
/completions), providers with `fim = "none"` (and Messages APIs) are skipped for FIM requests,
and a model none of whose providers can fill in the middle answers a 400 in OpenAI's shape."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from providers.upstream.openai_wire import FimStyle, fim_url
from testkit.gateway_app import REDIS_URL, Gateway, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture
async def fim_gateway(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[Gateway]:
    base = mock_upstream.base_url
    root = base.removesuffix("/v1")
    providers: dict[str, Any] = {
        "ds": {"kind": "openai", "base_url": base, "fim": "deepseek_beta"},
        "oai": {"kind": "openai", "base_url": base},  # fim = "suffix", the default
        "nofim": {"kind": "openai", "base_url": base, "fim": "none"},
        "claude": {"kind": "anthropic", "base_url": root},
    }
    models: dict[str, Any] = {
        "ds-model": {
            "routes": [
                {"provider": "nofim", "model": "echo"},
                {"provider": "ds", "model": "echo", "thinking": True},
            ]
        },
        "oai-model": {"routes": [{"provider": "oai", "model": "echo"}]},
        "chat-only": {
            "routes": [
                {"provider": "nofim", "model": "echo"},
                {"provider": "claude", "model": "echo"},
            ]
        },
    }
    settings = gateway_settings(mock_upstream, redis_prefix, providers=providers, models=models)
    runner, url = await start_gateway(settings)
    redis = Redis.from_url(REDIS_URL)
    secret, _ = await KeyStore(redis, prefix=redis_prefix).create(KeyCreate(name="fim"))
    await redis.aclose()
    try:
        yield Gateway(
            url, secret, mock_upstream, runner.app, redis_prefix, settings.server.max_body_bytes
        )
    finally:
        await runner.cleanup()


async def test_deepseek_style_upstream_gets_its_beta_path(fim_gateway: Gateway) -> None:
    # DeepSeek's documented client: the openai SDK with base_url ending in /beta.
    sdk = fim_gateway.async_client(base_url=f"{fim_gateway.root}/beta")
    resp = await sdk.completions.create(
        model="ds-model", prompt=PREFIX, suffix=SUFFIX, max_tokens=50, stop=["zzz"]
    )
    assert resp.choices[0].text  # the mock echoes the prompt's words
    (sent,) = fim_gateway.mock.requests
    assert sent.path == "/beta/completions"  # the `nofim` route was skipped
    body = sent.body
    assert (body["prompt"], body["suffix"], body["model"]) == (PREFIX, SUFFIX, "echo")
    assert body["max_tokens"] == 50 and body["stop"] == ["zzz"]
    assert "thinking" not in body and "messages" not in body  # FIM never thinks


async def test_openai_style_upstream_gets_suffix_on_completions(fim_gateway: Gateway) -> None:
    stream = await fim_gateway.async_client().completions.create(
        model="oai-model",
        prompt=PREFIX,
        suffix=SUFFIX,
        max_tokens=50,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
        usage = chunk.usage or usage
    assert text.split() == PREFIX.split()
    assert usage is not None and usage.completion_tokens
    (sent,) = fim_gateway.mock.requests
    assert sent.path == "/v1/completions"
    assert (sent.body["prompt"], sent.body["suffix"], sent.body["stream"]) == (PREFIX, SUFFIX, True)


async def test_chat_requests_still_take_the_first_route(fim_gateway: Gateway) -> None:
    await fim_gateway.async_client().completions.create(
        model="ds-model", prompt=PREFIX, max_tokens=5
    )
    (sent,) = fim_gateway.mock.requests
    assert sent.path == "/v1/completions" and "suffix" not in sent.body


async def test_no_provider_that_fills_in_the_middle_is_a_400(fim_gateway: Gateway) -> None:
    raw = await fim_gateway.post_raw(
        {"model": "chat-only", "prompt": PREFIX, "suffix": SUFFIX}, path="/beta/completions"
    )
    assert raw.status == 400
    with pytest.raises(openai.BadRequestError) as caught:
        await fim_gateway.async_client().completions.create(
            model="chat-only", prompt=PREFIX, suffix=SUFFIX
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "suffix" and error["type"] == "invalid_request_error"
    assert "nofim, claude" in error["message"]
    assert not fim_gateway.mock.requests
    # Without `suffix` the same model serves.
    ok = await fim_gateway.async_client().completions.create(
        model="chat-only", prompt=PREFIX, max_tokens=3
    )
    assert ok.choices[0].text


def test_unknown_fim_style_is_refused(mock_upstream: MockUpstream) -> None:
    providers = {"x": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "fim": "yes"}}
    with pytest.raises(ValueError, match="fim"):
        gateway_settings(mock_upstream, f"test:{uuid.uuid4().hex}:", providers=providers)


@pytest.mark.parametrize(
    ("base_url", "fim", "url"),
    [
        (
            "https://api.deepseek.com/v1",
            "deepseek_beta",
            "https://api.deepseek.com/beta/completions",
        ),
        ("https://api.deepseek.com/", "deepseek_beta", "https://api.deepseek.com/beta/completions"),
        ("http://proxy:8080/ds/v1/", "deepseek_beta", "http://proxy:8080/ds/beta/completions"),
        ("http://vllm:8000/v1/", "suffix", "http://vllm:8000/v1/completions"),
    ],
)
def test_fim_url_per_style(base_url: str, fim: FimStyle, url: str) -> None:
    assert fim_url(base_url, fim) == url
