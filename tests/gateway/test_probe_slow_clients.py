"""Slow and odd clients on raw sockets: a request head or body that never finishes arriving, a
stream nobody reads, an `Expect` the gateway does not know. Each is bounded (closed, or answered
in the API's error shape with an `x-request-id`) and holds no slot or reservation afterwards."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest

from testkit.gateway_app import gateway_settings
from testkit.mock_upstream import MockUpstream
from testkit.rawhttp import exchange, parse_answer, request_bytes
from tests.support.faults import eventually
from tests.support.probed import Probed, probed_gateway

CHAT = {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {**CHAT, "max_tokens": 5}
LONG_WORD = "x" * 2000  # one echoed word per frame: a few thousand frames outgrow the buffers


@pytest.fixture
async def gw(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[Probed]:
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        server={
            "host": "127.0.0.1",
            "port": 0,
            "max_body_bytes": 64 * 1024,
            "keepalive_s": 0.1,
            "request_head_timeout_s": 0.5,
            "request_body_timeout_s": 0.5,
            "write_stall_timeout_s": 0.5,
        },
        admin={"api_key": "admin-probe"},
    )
    async with probed_gateway(settings, mock_upstream) as gateway:
        yield gateway


async def connect(
    gw: Probed, *, receive_buffer: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    if receive_buffer is not None:  # before connecting, so the window stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    port = int(gw.root.rsplit(":", 1)[1])
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def closed_unanswered(gw: Probed, sent: bytes) -> bytes:
    """What the gateway sends back before it closes a connection that sent `sent`."""
    reader, writer = await connect(gw)
    try:
        writer.write(sent)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"],
    ids=["nothing", "half a head"],
)
async def test_a_connection_without_a_whole_request_head_is_closed(gw: Probed, sent: bytes) -> None:
    assert await closed_unanswered(gw, sent) == b""


async def test_a_kept_alive_connection_serves_request_after_request(gw: Probed) -> None:
    body = json.dumps(CHAT).encode()
    head = {**gw.auth_headers(), "Content-Type": "application/json"}
    request = request_bytes(
        "POST", "/v1/chat/completions", {**head, "Content-Length": str(len(body))}, body
    )
    request = request.replace(b"Connection: close", b"Connection: keep-alive")
    reader, writer = await connect(gw)
    try:
        for _ in range(3):  # each within the head timeout of the last answer
            writer.write(request)
            data = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            answer = parse_answer(data)
            body_bytes = await reader.readexactly(int(answer.headers["Content-Length"]))
            assert answer.status == 200, body_bytes
            await asyncio.sleep(0.2)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/messages", MESSAGES),
        ("/admin/keys", {"name": "slow"}),
    ],
)
async def test_a_body_that_never_finishes_arriving_is_a_408(
    gw: Probed, path: str, body: dict[str, object]
) -> None:
    raw = json.dumps(body).encode()
    secret = "admin-probe" if path.startswith("/admin") else gw.key
    headers = {
        "Authorization": f"Bearer {secret}",
        "Content-Type": "application/json",
        "Content-Length": str(len(raw) + 100),  # 100 bytes are never sent
    }
    answer = await exchange(gw.root, request_bytes("POST", path, headers, raw))
    assert answer.status == 408 and answer.headers["x-request-id"]
    error = answer.json()
    if path == "/v1/messages":
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    else:
        assert error["error"]["code"] == "request_timeout"
    assert await gw.held() == (0, 0)


async def test_a_stream_nobody_reads_is_dropped_and_frees_its_slot(gw: Probed) -> None:
    body = {
        "model": "mock/echo-chunks-6000",
        "messages": [{"role": "user", "content": LONG_WORD}],
        "stream": True,
    }
    raw = json.dumps(body).encode()
    headers = {**gw.auth_headers(), "Content-Type": "application/json"}
    headers["Content-Length"] = str(len(raw))
    reader, writer = await connect(gw, receive_buffer=4096)
    try:
        writer.write(request_bytes("POST", "/v1/chat/completions", headers, raw))
        await writer.drain()

        async def admitted() -> bool:
            return (await gw.held())[0] == 1

        await eventually(admitted)
        await gw.mock.request_arrived.wait()

        async def freed() -> bool:
            return await gw.held() == (0, 0)

        await eventually(freed, within_s=20)  # without ever reading a byte
        await gw.settled()
        assert await gw.statuses() == ["499"]
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_an_unknown_expectation_is_a_417_in_the_api_shape(gw: Probed, path: str) -> None:
    raw = json.dumps(MESSAGES).encode()
    headers = {**gw.auth_headers(), "Content-Type": "application/json", "Expect": "200-ok"}
    headers["Content-Length"] = str(len(raw))
    answer = await exchange(gw.root, request_bytes("POST", path, headers, raw))
    assert answer.status == 417 and answer.headers["x-request-id"]
    error = answer.json()
    message = error["error"]["message"]
    assert "200-ok" in message
    assert ("type" in error) == (path == "/v1/messages")
    assert ("request-id" in answer.headers) == (path == "/v1/messages")


async def test_expect_100_continue_is_honoured(gw: Probed) -> None:
    raw = json.dumps(CHAT).encode()
    headers = {**gw.auth_headers(), "Content-Type": "application/json", "Expect": "100-continue"}
    headers["Content-Length"] = str(len(raw))
    reader, writer = await connect(gw)
    try:
        head = request_bytes("POST", "/v1/chat/completions", headers)
        writer.write(head)
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert interim.startswith(b"HTTP/1.1 100")
        writer.write(raw)
        async with asyncio.timeout(10):
            answer = parse_answer(await reader.read())
        assert answer.status == 200 and answer.headers["x-request-id"]
    finally:
        writer.close()
