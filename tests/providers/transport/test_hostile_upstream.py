"""providers/transport/http1.py against an upstream that answers what no well-behaved server would:
a local asyncio server on 127.0.0.1 writes each bad answer byte for byte, and the client must
refuse it cleanly (bounded memory and time, the event loop free) or read it correctly."""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from providers.transport import http1
from providers.transport.http1 import Http1Error, Http1Pool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Upstream:
    """A raw server on 127.0.0.1 serving each connection with `handler`; it counts connections
    and sets `closed` when a client closes one (the server still holding it open)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = asyncio.Event()
        self.peers: list[tuple[str, int]] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)
            self.connections += 1
            self.peers.append(writer.get_extra_info("peername"))
            try:
                await self.handler(reader, writer)
                await reader.read()  # until the client closes its end
                self.closed.set()
            except (ConnectionError, asyncio.IncompleteReadError):
                self.closed.set()
            except asyncio.CancelledError:
                pass  # the test is over
            finally:
                self._tasks.discard(task)
                writer.close()

        self._server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return head


def answering(*replies: bytes) -> Handler:
    """Answers requests with `replies` in turn, whichever connection they come on (a refused
    answer closes its connection: the next request comes on a new one)."""
    left = list(replies)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while left:
            await read_request(reader)
            writer.write(left.pop(0))
            await writer.drain()

    return handler


def answer(body: bytes, *extra: str, status: str = "200 OK", length: bool = True) -> bytes:
    lines = [f"HTTP/1.1 {status}", *extra]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


BODY = b'{"real": 1}'


@pytest.fixture
async def pools() -> AsyncIterator[list[Http1Pool]]:
    made: list[Http1Pool] = []
    yield made
    for pool in made:
        pool.close()


def pool_for(pools: list[Http1Pool], url: str, **options: object) -> Http1Pool:
    pool = Http1Pool(url, {}, connect_timeout_s=2.0, max_connections=4, **options)  # type: ignore[arg-type]
    pools.append(pool)
    return pool


def soon(seconds: float = 10.0) -> float:
    return asyncio.get_running_loop().time() + seconds


async def fetch(pool: Http1Pool, seconds: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    resp = await pool.post("/v1/chat/completions", {}, b"{}", soon(seconds))
    try:
        return resp.status, resp.headers, await resp.read()
    finally:
        resp.close()


class LoopLag:
    """Measures how late a 10 ms timer fires, again and again, while the test runs."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, loop.time() - due)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


# Header bounds


async def test_two_megabytes_of_one_repeated_header_are_refused_without_stalling_the_loop(
    pools: list[Http1Pool],
) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + b"X-Same: aaaaaaaa\r\n" * 110_000
    async with Upstream(answering(head + b"\r\n{}")) as url:
        with LoopLag() as lag:
            started = time.perf_counter()
            with pytest.raises(Http1Error, match="more than 128 header fields"):
                await fetch(pool_for(pools, url))
            took = time.perf_counter() - started
    # Refused at the 129th header, not after parsing (and joining) all 110 000; other tasks'
    # timers kept firing. Generous bounds: the old client took tens of seconds here.
    assert took < 5.0
    assert lag.worst < 2.0


async def test_twenty_megabytes_of_distinct_headers_are_refused(pools: list[Http1Pool]) -> None:
    value = b"v" * 90
    fields = b"".join(b"X-H%d: %s\r\n" % (i, value) for i in range(200_000))
    async with Upstream(answering(b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n")) as url:
        with pytest.raises(Http1Error, match="more than 128 header fields"):
            await fetch(pool_for(pools, url))


async def test_128_headers_are_read_and_129_refused(pools: list[Http1Pool]) -> None:
    fields = [f"X-H{i}: {i}" for i in range(127)]  # and Content-Length
    async with Upstream(
        answering(answer(BODY, *fields), answer(BODY, *fields, "X-One: more"))
    ) as url:
        pool = pool_for(pools, url)
        status, headers, body = await fetch(pool)
        assert (status, headers["x-h126"], body) == (200, "126", BODY)
        with pytest.raises(Http1Error, match="more than 128 header fields"):
            await fetch(pool)


async def test_repeated_names_are_joined_in_order(pools: list[Http1Pool]) -> None:
    async with Upstream(answering(answer(BODY, "Via: a", "X-Other: 1", "via: b", "VIA: c"))) as url:
        _, headers, _ = await fetch(pool_for(pools, url))
    assert headers["via"] == "a, b, c"
    assert headers["x-other"] == "1"


async def test_a_header_field_over_8_kib_is_refused(pools: list[Http1Pool]) -> None:
    near = "X-Big: " + "b" * (8192 - 5)  # name and value: 8192 bytes
    over = "X-Big: " + "b" * (9 * 1024)
    async with Upstream(answering(answer(BODY, near), answer(BODY, over))) as url:
        pool = pool_for(pools, url)
        status, headers, _ = await fetch(pool)
        assert status == 200 and len(headers["x-big"]) == 8192 - 5
        with pytest.raises(Http1Error, match="'x-big' is longer than 8192 bytes"):
            await fetch(pool)


async def test_a_head_that_never_ends_is_refused_before_the_deadline(
    pools: list[Http1Pool],
) -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        for _ in range(64):  # 4 MiB of one value, never a line end
            writer.write(b"e" * 65536)
            await writer.drain()

    async with Upstream(endless) as url:
        with pytest.raises(Http1Error, match="head is longer than"):
            await fetch(pool_for(pools, url), seconds=60)


# Unsolicited bytes, informational answers


async def test_an_unsolicited_answer_on_an_idle_connection_closes_it(
    pools: list[Http1Pool],
) -> None:
    """A server that answers 408 on an idle keep-alive connection before closing it: the 408
    must not become the next request's answer."""
    sent = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if sent.is_set():  # the second connection: a plain answer
            writer.write(answer(BODY))
            return
        writer.write(answer(b'{"first": 1}'))
        await writer.drain()
        await asyncio.sleep(0)
        writer.write(answer(b"timeout", status="408 Request Timeout"))
        await writer.drain()
        sent.set()

    upstream = Upstream(handler)
    async with upstream as url:
        pool = pool_for(pools, url)
        assert await fetch(pool) == (200, {"content-length": "12"}, b'{"first": 1}')
        async with asyncio.timeout(10):
            await sent.wait()
            await upstream.closed.wait()  # the client closed the connection the 408 came on
        status, _, body = await fetch(pool)
    assert (status, body, upstream.connections) == (200, BODY, 2)


async def test_an_answer_glued_to_the_previous_one_is_not_read_as_its_body(
    pools: list[Http1Pool],
) -> None:
    seen = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        seen += 1
        await read_request(reader)
        if seen == 1:  # the answer and an unsolicited 408 in one write
            writer.write(answer(b'{"first": 1}') + answer(b"timeout", status="408 Timeout"))
        else:
            writer.write(answer(BODY))

    upstream = Upstream(handler)
    async with upstream as url:
        pool = pool_for(pools, url)
        assert (await fetch(pool))[2] == b'{"first": 1}'
        status, _, body = await fetch(pool)
    assert (status, body, upstream.connections) == (200, BODY, 2)


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
    ],
    ids=["100", "103", "100-then-103"],
)
async def test_informational_answers_are_skipped(pools: list[Http1Pool], interim: bytes) -> None:
    async with Upstream(answering(interim + answer(BODY), answer(BODY))) as url:
        pool = pool_for(pools, url)
        status, headers, body = await fetch(pool)
        assert (status, body, "link" in headers) == (200, BODY, False)
        assert (await fetch(pool))[::2] == (200, BODY)  # the connection was reused


async def test_informational_answers_sent_in_pieces_are_skipped(pools: list[Http1Pool]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for piece in (b"HTTP/1.1 103 Ea", b"rly Hints\r\nLink: </a>\r\n\r\n", answer(BODY)):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)

    async with Upstream(handler) as url:
        assert (await fetch(pool_for(pools, url)))[::2] == (200, BODY)


# Idle expiry, keepalive


async def test_an_idle_connection_expires_and_the_next_request_opens_a_new_one(
    pools: list[Http1Pool],
) -> None:
    upstream = Upstream(answering(answer(BODY), answer(BODY)))
    async with upstream as url:
        pool = pool_for(pools, url, idle_expiry_s=0.2)
        assert (await fetch(pool))[2] == BODY
        async with asyncio.timeout(10):
            await upstream.closed.wait()  # closed by the pool, not by the server
        assert (await fetch(pool))[2] == BODY
    assert upstream.connections == 2


def keepalive_timer(local_port: int) -> str | None:
    """The timer /proc/net/tcp shows for the socket bound to 127.0.0.1:`local_port` ("02":
    keepalive), None when the socket is not listed."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{local_port:04X}":
            return fields[5].split(":")[0]
    return None


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")
async def test_connections_have_tcp_keepalive(pools: list[Http1Pool]) -> None:
    upstream = Upstream(answering(answer(BODY)))
    async with upstream as url:
        assert (await fetch(pool_for(pools, url)))[2] == BODY
        # "01" (retransmit) shows while the last segment waits for its ACK on a busy machine
        timer = keepalive_timer(upstream.peers[0][1])
        async with asyncio.timeout(10):
            while timer != "02":
                await asyncio.sleep(0.01)
                timer = keepalive_timer(upstream.peers[0][1])


# Content-Encoding


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "snappy", "gzip, br"])
async def test_an_encoding_the_client_cannot_decode_is_refused(
    pools: list[Http1Pool], coding: str
) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(answer(b"\x1b\x2a\x00\xf8compressed", f"Content-Encoding: {coding}"))

    async with Upstream(handler) as url:
        with pytest.raises(Http1Error, match=f"encoded as '{coding}'"):
            await fetch(pool_for(pools, url))
    assert b"\r\nAccept-Encoding: identity\r\n" in seen[0]


async def test_raw_deflate_is_decoded(pools: list[Http1Pool]) -> None:
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    body = raw.compress(BODY * 50) + raw.flush()
    wrapped = zlib.compress(BODY * 50)
    encoded = "Content-Encoding: deflate"
    async with Upstream(answering(answer(body, encoded), answer(wrapped, encoded))) as url:
        pool = pool_for(pools, url)
        assert (await fetch(pool))[2] == BODY * 50
        assert (await fetch(pool))[2] == BODY * 50


async def test_every_member_of_a_gzip_body_is_read(pools: list[Http1Pool]) -> None:
    body = gzip.compress(b'{"part": ') + gzip.compress(b'"two"}')
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(b), b) for b in (body[:7], body[7:30], body[30:]))
    async with Upstream(
        answering(
            answer(body, "Content-Encoding: gzip"),
            answer(chunked + b"0\r\n\r\n", "Content-Encoding: gzip", "Transfer-Encoding: chunked",
                   length=False),
        )
    ) as url:  # fmt: skip
        pool = pool_for(pools, url)
        assert (await fetch(pool))[2] == b'{"part": "two"}'
        assert (await fetch(pool))[2] == b'{"part": "two"}'


async def test_a_truncated_gzip_body_is_an_error(pools: list[Http1Pool]) -> None:
    body = gzip.compress(BODY * 100)[:-12]
    async with Upstream(answering(answer(body, "Content-Encoding: gzip"))) as url:
        with pytest.raises(Http1Error, match="ended before its end"):
            await fetch(pool_for(pools, url))


def gzip_bomb(inflated: int) -> bytes:
    """A gzip body of `inflated` zero bytes (about a thousandth of that compressed)."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    parts = [squeeze.compress(zeros) for _ in range(inflated >> 20)]
    return b"".join(parts) + squeeze.flush()


@pytest.mark.parametrize("limit", [16 << 20, 64 << 20])  # 64 MiB: the default body limit
async def test_a_gzip_bomb_fails_with_memory_near_the_body_limit(
    pools: list[Http1Pool], limit: int
) -> None:
    bomb = gzip_bomb(512 << 20)  # 0.5 MB that inflates to 512 MiB, in one read or a few
    limits = http1.AnswerLimits(max_body_bytes=limit)
    async with Upstream(answering(answer(bomb, "Content-Encoding: gzip"))) as url:
        pool = pool_for(pools, url, limits=limits)
        tracemalloc.start()
        try:
            with pytest.raises(Http1Error, match=f"decompresses to more than {limit} bytes"):
                await fetch(pool)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    # What was inflated up to the limit, and little else: not a copy of it, nor 512 MiB.
    assert peak < limit + (4 << 20), peak


@pytest.mark.parametrize("coding", ["gzip, chunked", "gzip", "identity, chunked", "deflate"])
async def test_a_transfer_encoding_other_than_chunked_is_refused_by_name(
    pools: list[Http1Pool], coding: str
) -> None:
    body = gzip.compress(BODY)
    framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    reply = answer(framed, f"Transfer-Encoding: {coding}", length=False)
    async with Upstream(answering(reply, answer(BODY))) as url:
        pool = pool_for(pools, url)
        with pytest.raises(Http1Error, match=f"Transfer-Encoding is '{coding}'"):
            await fetch(pool)
        assert await fetch(pool) == (200, {"content-length": str(len(BODY))}, BODY)


async def test_the_body_limit_holds_for_plain_and_encoded_bodies(pools: list[Http1Pool]) -> None:
    limits = http1.AnswerLimits(max_body_bytes=1000)
    encoded = gzip.compress(b"x" * 1001)
    async with Upstream(
        answering(
            answer(b"x" * 1000), answer(b"x" * 1001), answer(encoded, "Content-Encoding: gzip")
        )
    ) as url:
        pool = pool_for(pools, url, limits=limits)
        assert len((await fetch(pool))[2]) == 1000
        with pytest.raises(Http1Error, match="longer than 1000 bytes"):
            await fetch(pool)
        with pytest.raises(Http1Error, match="decompresses to more than 1000 bytes"):
            await fetch(pool)


# A body that ends with the connection


async def test_a_read_to_close_body_cut_by_a_reset_is_an_error(pools: list[Http1Pool]) -> None:
    got_first_part = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b'{"trunc', "Content-Type: application/json", length=False))
        await writer.drain()
        await got_first_part.wait()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # closed with linger 0: a TCP reset

    async with Upstream(handler) as url:
        resp = await pool_for(pools, url).post("/v1/chat/completions", {}, b"{}", soon())
        try:
            assert await resp.readany() == b'{"trunc'
            got_first_part.set()
            with pytest.raises(Http1Error, match="cut off"):
                async with asyncio.timeout(10):
                    await resp.readany()
        finally:
            resp.close()


async def test_a_read_to_close_body_closed_cleanly_is_complete(pools: list[Http1Pool]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(BODY, length=False))
        await writer.drain()
        writer.close()

    async with Upstream(handler) as url:
        assert (await fetch(pool_for(pools, url)))[::2] == (200, BODY)


def test_the_same_under_uvloop() -> None:
    """The gateway serves on uvloop, whose transports and sockets are not asyncio's."""
    uvloop = pytest.importorskip("uvloop")
    linux = Path("/proc/net/tcp").exists()

    async def scenarios() -> None:
        pools: list[Http1Pool] = []
        try:
            await test_an_unsolicited_answer_on_an_idle_connection_closes_it(pools)
            await test_a_read_to_close_body_cut_by_a_reset_is_an_error(pools)
            await test_informational_answers_are_skipped(pools, b"HTTP/1.1 100 Continue\r\n\r\n")
            await test_a_head_that_never_ends_is_refused_before_the_deadline(pools)
            if linux:
                await test_connections_have_tcp_keepalive(pools)
        finally:
            for pool in pools:
                pool.close()

    uvloop.run(scenarios())
