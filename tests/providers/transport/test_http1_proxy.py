"""providers/transport/http1.py through an egress proxy (testkit/proxy_server.py, a real forward
proxy on 127.0.0.1): CONNECT tunnels with TLS for https, the absolute form for http, credentials as
Proxy-Authorization, refusals; and providers/transport/http1_proxy.py's reading of the
environment."""

from __future__ import annotations

import asyncio
import base64
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from providers.transport.http1 import Http1Error, Http1Pool
from providers.transport.http1_proxy import Proxy, proxy_for
from testkit.proxy_server import RecordingProxy

BODY = b'{"through": "the proxy"}'
REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


async def serve_requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every request of the connection with REPLY."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.partition(b":")[2])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(REPLY)
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting it) for a certificate of 127.0.0.1."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


@pytest.fixture
async def pools() -> AsyncIterator[list[Http1Pool]]:
    made: list[Http1Pool] = []
    yield made
    for pool in made:
        pool.close()


async def fetch(pool: Http1Pool) -> tuple[int, bytes]:
    deadline = asyncio.get_running_loop().time() + 10
    resp = await pool.post("/v1/chat/completions", {}, b"{}", deadline)
    try:
        return resp.status, await resp.read()
    finally:
        resp.close()


async def test_https_goes_through_a_connect_tunnel_with_the_proxys_credentials(
    pools: list[Http1Pool], tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    server_tls, client_tls = tls
    upstream = await asyncio.start_server(serve_requests, "127.0.0.1", 0, ssl=server_tls)
    port = upstream.sockets[0].getsockname()[1]
    try:
        async with RecordingProxy() as proxy:
            url = proxy.url.replace("http://", "http://us%40er:p%3Ass@")
            pool = Http1Pool(
                f"https://127.0.0.1:{port}/v1",
                {},
                connect_timeout_s=5,
                max_connections=2,
                proxy=Proxy.parse(url),
                ssl_context=client_tls,
            )
            pools.append(pool)
            assert await fetch(pool) == (200, BODY)
            assert await fetch(pool) == (200, BODY)  # the tunnel is kept and reused
    finally:
        upstream.close()
    [(line, headers)] = proxy.heads
    assert line == f"CONNECT 127.0.0.1:{port} HTTP/1.1"
    assert headers["host"] == f"127.0.0.1:{port}"
    assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"us@er:p:ss").decode()


async def test_http_goes_to_the_proxy_in_absolute_form(pools: list[Http1Pool]) -> None:
    upstream = await asyncio.start_server(serve_requests, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    try:
        async with RecordingProxy() as proxy:
            proxied = Proxy.parse(proxy.url.replace("http://", "http://user:secret@"))
            pool = Http1Pool(
                f"http://127.0.0.1:{port}/v1", {}, connect_timeout_s=5, max_connections=2,
                proxy=proxied,
            )  # fmt: skip
            pools.append(pool)
            assert await fetch(pool) == (200, BODY)
    finally:
        upstream.close()
    [(line, headers)] = proxy.heads
    assert line == f"POST http://127.0.0.1:{port}/v1/chat/completions HTTP/1.1"
    assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"user:secret").decode()


async def test_a_proxy_that_refuses_the_tunnel_is_a_clear_error_without_the_credentials(
    pools: list[Http1Pool],
) -> None:
    async with RecordingProxy(refuse=True) as proxy:
        pool = Http1Pool(
            "https://127.0.0.1:9/v1", {}, connect_timeout_s=5, max_connections=2,
            proxy=Proxy.parse(proxy.url.replace("http://", "http://user:hunter2@")),
        )  # fmt: skip
        pools.append(pool)
        with pytest.raises(Http1Error, match=r"refused the tunnel \(HTTP 407\)") as caught:
            await fetch(pool)
    assert "hunter2" not in str(caught.value)


def test_a_proxys_credentials_never_show() -> None:
    proxy = Proxy.parse("http://user:hunter2@proxy.corp:3128")
    assert (proxy.host, proxy.port, proxy.address) == ("proxy.corp", 3128, "proxy.corp:3128")
    assert "hunter2" not in repr(proxy)
    with pytest.raises(ValueError, match="scheme 'socks5' is not supported") as caught:
        Proxy.parse("socks5://user:hunter2@proxy.corp:1080")
    assert "hunter2" not in str(caught.value)
    assert Proxy.parse("proxy.corp:8080") == Proxy("proxy.corp", 8080)


@pytest.mark.parametrize(
    ("url", "environ", "expected"),
    [
        ("https://api.x.com/v1", {"HTTPS_PROXY": "http://p:1"}, "http://p:1"),
        ("https://api.x.com/v1", {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://p:1"},
         "http://lower:1"),
        ("https://api.x.com/v1", {"HTTP_PROXY": "http://p:1"}, None),
        ("http://api.x.com/v1", {"http_proxy": "http://p:1"}, "http://p:1"),
        ("https://api.x.com/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "x.com"}, None),
        ("https://api.x.com/v1", {"HTTPS_PROXY": "http://p:1", "no_proxy": ".x.com"}, None),
        ("https://api.x.com/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "y.com, *"}, None),
        ("https://api.x.com/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "i.x.com"},
         "http://p:1"),
        ("https://api.x.com/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "notx.com"},
         "http://p:1"),
        ("https://10.1.2.3:8443/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"},
         None),
        ("https://10.1.2.3:8443/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3:443"},
         "http://p:1"),
        ("https://10.1.2.3:8443/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3:8443"},
         None),
        ("http://[::1]:8000/v1", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "::1"}, None),
        ("http://[::1]:8000/v1", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "[::1]:8000"}, None),
    ],
)  # fmt: skip
def test_the_environment_names_the_proxy_unless_no_proxy_covers_the_host(
    url: str, environ: dict[str, str], expected: str | None
) -> None:
    assert proxy_for(url, environ) == expected


def test_a_tunnel_under_uvloop(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """The gateway serves on uvloop: TLS is started on the tunnel by its start_tls."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        pools: list[Http1Pool] = []
        try:
            await test_https_goes_through_a_connect_tunnel_with_the_proxys_credentials(pools, tls)
        finally:
            for pool in pools:
                pool.close()

    uvloop.run(scenario())
