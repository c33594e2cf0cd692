"""An https upstream behind a private certificate authority: refused with a message that says the
certificate could not be verified until the gateway trusts the authority, by the provider's
`ca_file` or by SSL_CERT_FILE; and settings that could never be sent (a header value with a line
break, an unreadable ca_file) stop the start with a settings error naming the provider."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from gateway.config.providers import ProviderSettings
from gateway.config.settings import Settings
from gateway.provider_factory import upstream_config
from providers.errors import UpstreamUnavailable
from providers.types import ChatRequest, Message, TextDelta
from providers.upstream.openai import OpenAIUpstream

ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


@pytest.fixture
def private_ca(tmp_path: Path) -> tuple[Path, Path]:
    """(certificate, key) of a self-signed certificate for 127.0.0.1: its own authority."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed")
    cert, key = tmp_path / "ca.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
async def https_upstream(private_ca: tuple[Path, Path]) -> AsyncIterator[str]:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(*private_ca)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"https://127.0.0.1:{port}/v1"
    await runner.cleanup()


async def ask(base_url: str, **settings: Any) -> str:
    provider = ProviderSettings(base_url=base_url, proxy="direct", **settings)
    upstream = OpenAIUpstream(upstream_config("private", provider))
    await upstream.open()
    try:
        request = ChatRequest(model="m", messages=(Message("user", "hello"),))
        events = [event async for event in upstream.chat(request)]
        return "".join(e.text for e in events if isinstance(e, TextDelta))
    finally:
        await upstream.close()


async def test_an_untrusted_certificate_is_said_to_the_client(
    https_upstream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(UpstreamUnavailable) as caught:
        await ask(https_upstream)
    message = caught.value.message
    assert message.startswith("Provider 'private' could not be reached: TLS certificate")
    assert "TLS certificate verification failed" in message
    assert "self-signed certificate" in message  # OpenSSL's reason, for the operator


async def test_a_private_ca_is_trusted_by_ca_file(
    https_upstream: str, private_ca: tuple[Path, Path]
) -> None:
    assert await ask(https_upstream, ca_file=private_ca[0]) == "hi"


async def test_a_private_ca_is_trusted_by_ssl_cert_file(
    https_upstream: str, private_ca: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(private_ca[0]))
    assert await ask(https_upstream) == "hi"


def settings_with(**provider: Any) -> Settings:
    provider = {"kind": "openai", "base_url": "https://api.example.com/v1", **provider}
    return Settings(use_presets=False, providers={"acme": provider})


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({"X-Tenant": "a\r\nInjected: 1"}, "the header 'X-Tenant' in `headers` holds a line break"),
        ({"X-Tenant": "a\n"}, "the header 'X-Tenant' in `headers` holds a line break"),
        ({"X-Bad Name": "a"}, "the header 'X-Bad Name' in `headers` has a name that is not"),
        ({"X-Tenant": "ключ"}, "holds a character beyond latin-1"),
    ],
)
def test_an_unsendable_header_is_a_settings_error_naming_the_provider(
    headers: dict[str, str], problem: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        settings_with(headers=headers)
    said = str(caught.value)
    assert f"provider 'acme': {problem}" in said or problem in said
    assert "provider 'acme'" in said
    assert "Injected" not in said  # the value is never repeated


def test_an_unreadable_ca_file_is_a_settings_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    for path in (tmp_path / "missing.pem", junk):
        with pytest.raises(ValidationError, match="provider 'acme': ca_file .* is not a readable"):
            settings_with(ca_file=str(path))
