"""An upstream provider's settings as the gateway loads and applies them: account keys checked at
load (a clear settings error naming the provider and the variable, never the key), egress
proxies from the environment or the provider's own setting (a real forward proxy on 127.0.0.1
records what passed through it), and the upstream busy-wait off unless a provider asks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config.providers import ProviderSettings
from gateway.config.settings import Settings
from gateway.provider_factory import upstream_config
from providers.types import ChatRequest, Message, TextDelta
from providers.upstream.openai import OpenAIUpstream
from testkit.mock_upstream import MockUpstream
from testkit.proxy_server import RecordingProxy

PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the proxy variables it means; the machine's own never leak in."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def settings_with(**provider: Any) -> Settings:
    provider = {"kind": "openai", "base_url": "https://api.example.com/v1", **provider}
    return Settings(use_presets=False, providers={"acme": provider})


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("sk-good\n", "holds a line break"),
        ("sk-\rinjected: 1", "holds a line break"),
        ("sk-\x01bad", "holds the control character '\\x01'"),
        ("sk-\x85bad", "holds the control character '\\x85'"),
        ("sk-ключ", "holds a character beyond latin-1"),
    ],
)
@pytest.mark.parametrize("field", ["api_key_env", "api_key_envs"])
def test_an_unsendable_key_is_a_settings_error_naming_provider_and_variable(
    monkeypatch: pytest.MonkeyPatch, key: str, problem: str, field: str
) -> None:
    monkeypatch.setenv("ACME_KEY_2", key)
    value: Any = "ACME_KEY_2" if field == "api_key_env" else ["ACME_KEY_2"]
    with pytest.raises(ValidationError) as caught:
        settings_with(**{field: value})
    said = str(caught.value)
    assert f"provider 'acme': the key in environment variable ACME_KEY_2 {problem}" in said
    assert key.strip() not in said


def test_sendable_keys_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_KEY", "sk-abc_DEF.123~+/=")
    monkeypatch.setenv("ACME_KEY_2", "sk-second key with spaces")
    settings = settings_with(api_key_env="ACME_KEY", api_key_envs=["ACME_KEY_2", "ACME_UNSET"])
    assert len(settings.providers["acme"].accounts()) == 2


def test_a_presets_unsendable_key_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-pasted\r\n")
    with pytest.raises(ValidationError, match="provider 'deepseek': the key in environment"):
        Settings(use_presets=True)


def test_an_unusable_proxy_is_a_settings_error_without_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValidationError, match="scheme 'socks5' is not supported") as caught:
        settings_with(proxy="socks5://me:hunter2@proxy.corp:1080")
    assert "hunter2" not in str(caught.value)
    monkeypatch.setenv("HTTPS_PROXY", "https://me:hunter2@proxy.corp:3128")
    with pytest.raises(ValidationError, match="provider 'acme': the proxy in the environment"):
        settings_with()


def test_the_proxy_comes_from_the_provider_or_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "internal.corp")
    proxy_of = lambda **p: upstream_config("acme", ProviderSettings(**p)).proxy  # noqa: E731
    assert proxy_of(base_url="https://api.example.com/v1") == "http://proxy.corp:3128"
    assert proxy_of(base_url="https://vllm.internal.corp/v1") is None
    assert proxy_of(base_url="http://api.example.com/v1") is None  # HTTP_PROXY unset
    assert proxy_of(base_url="https://api.example.com/v1", proxy="direct") is None
    own = "http://u:s3cret@egress:8080"
    config = upstream_config("acme", ProviderSettings(base_url="https://x.corp/v1", proxy=own))
    assert config.proxy == own
    assert "s3cret" not in repr(config)


def test_an_upstream_does_not_busy_wait_unless_its_provider_asks() -> None:
    assert settings_with().providers["acme"].busy_wait is False
    assert settings_with(busy_wait=True).providers["acme"].busy_wait is True


@pytest.fixture
async def proxy() -> AsyncIterator[RecordingProxy]:
    async with RecordingProxy() as running:
        yield running


async def chat_and_models(settings: ProviderSettings) -> tuple[str, list[str]]:
    upstream = OpenAIUpstream(upstream_config("mock", settings))
    await upstream.open()
    try:
        request = ChatRequest(model="echo", messages=(Message("user", "via the proxy"),))
        events = [event async for event in upstream.chat(request)]
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        return text, [card.id for card in await upstream.models()]
    finally:
        await upstream.close()


async def test_chat_and_models_go_through_the_environments_proxy(
    monkeypatch: pytest.MonkeyPatch, mock_upstream: MockUpstream, proxy: RecordingProxy
) -> None:
    monkeypatch.setenv("http_proxy", proxy.url.replace("http://", "http://op:s3cret@"))
    text, models = await chat_and_models(ProviderSettings(base_url=mock_upstream.base_url))
    assert text == "via the proxy" and models
    lines = sorted(line for line, _ in proxy.heads)
    assert lines == [
        f"GET {mock_upstream.base_url}/models HTTP/1.1",
        f"POST {mock_upstream.base_url}/chat/completions HTTP/1.1",
    ]
    assert all(h["proxy-authorization"] == "Basic b3A6czNjcmV0" for _, h in proxy.heads)


@pytest.mark.parametrize("bypass", ["no_proxy", "direct"])
async def test_no_proxy_or_direct_goes_around_the_proxy(
    monkeypatch: pytest.MonkeyPatch, mock_upstream: MockUpstream, proxy: RecordingProxy, bypass: str
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    settings = ProviderSettings(base_url=mock_upstream.base_url)
    if bypass == "no_proxy":
        monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    else:
        settings = ProviderSettings(base_url=mock_upstream.base_url, proxy="direct")
    text, _ = await chat_and_models(settings)
    assert text == "via the proxy"
    assert proxy.heads == []
