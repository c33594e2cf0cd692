"""providers/transport/http1.py against raw asyncio servers that answer exactly the bytes each test
needs."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from plumbing import busy_wait
from plumbing.busy_wait import BusyWait, Spin
from providers.transport import http1
from providers.transport.http1 import ConnectTimeout, Http1Error, Http1Pool, Http1Timeout

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """Accepts connections on 127.0.0.1; each is served by `handler`; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    line, *rest = head.split("\r\n")
    headers = {}
    for header in rest:
        if header:
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return line, headers, body


def recording(seen: list[tuple[str, dict[str, str], bytes]], reply: bytes) -> Handler:
    """A handler that records every request of its connection in `seen` and answers `reply`."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():
            try:
                seen.append(await read_request(reader))
            except asyncio.IncompleteReadError:
                return
            writer.write(reply)

    return handler


def soon(seconds: float = 5.0) -> float:
    """A deadline `seconds` from now, in loop time."""
    return asyncio.get_running_loop().time() + seconds


def answer(body: bytes, *extra: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.fixture
async def pools() -> AsyncIterator[list[Http1Pool]]:
    made: list[Http1Pool] = []
    yield made
    for pool in made:
        pool.close()
        # Every answer awaited was counted once and uncounted once, whatever became of it.
        assert pool.busy.waiting == 0


def pool_for(pools: list[Http1Pool], url: str, limit: int = 8, **headers: str) -> Http1Pool:
    busy = BusyWait(Spin(0.05, 4))
    pool = Http1Pool(url, headers, connect_timeout_s=2.0, max_connections=limit, busy=busy)
    pools.append(pool)
    return pool


async def test_post_sends_the_body_and_reuses_the_connection(pools: list[Http1Pool]) -> None:
    seen: list[tuple[str, dict[str, str], bytes]] = []
    server = RawServer(
        recording(seen, answer(b'{"ok": true}', "Content-Type: application/json; charset=utf-8"))
    )
    async with server as url:
        pool = pool_for(pools, url, Authorization="Bearer k")
        for i in range(3):
            resp = await pool.post("/v1/chat/completions", {}, b'{"n": %d}' % i, soon())
            assert (resp.status, resp.content_type) == (200, "application/json")
            assert await resp.read() == b'{"ok": true}'
            resp.close()
    assert server.connections == 1
    line, headers, body = seen[2]
    assert line == "POST /v1/chat/completions HTTP/1.1"
    assert headers["authorization"] == "Bearer k" and headers["host"].startswith("127.0.0.1:")
    assert body == b'{"n": 2}'


async def test_a_header_given_per_request_replaces_the_pools_whatever_its_case(
    pools: list[Http1Pool],
) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answer(b"{}"))

    async with RawServer(handler) as url:
        pool = pool_for(pools, url, Authorization="Bearer pool")
        resp = await pool.post("/x", {"authorization": "Bearer account-2"}, b"", soon())
        await resp.read()
        resp.close()
    assert b"Bearer account-2" in seen[0] and b"Bearer pool" not in seen[0]
    with pytest.raises(ValueError):
        await pool.post("/x", {"X-Evil": "a\r\nHost: other"}, b"", soon())


async def test_each_request_carries_its_own_path_headers_and_length_beyond_the_kept_heads(
    pools: list[Http1Pool],
) -> None:
    seen: list[tuple[str, dict[str, str], bytes]] = []
    sent = []
    async with RawServer(recording(seen, answer(b"{}"))) as url:
        pool = pool_for(pools, url, Authorization="Bearer pool")
        for i in range(2 * http1._MAX_HEADS):  # more (path, headers) pairs than are kept
            account = {"Authorization": f"Bearer account-{i % 3}"} if i % 2 else {}
            path, body = f"/v1/p{i % 70}", b"x" * (i % 5)
            resp = await pool.post(path, account, body, soon())
            await resp.read()
            resp.close()
            sent.append((path, account.get("Authorization", "Bearer pool"), body))
    assert [(line.split()[1], h["authorization"], b) for line, h, b in seen] == sent


async def test_chunked_streams_arrive_as_they_are_sent(pools: list[Http1Pool]) -> None:
    go_on = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n")
        writer.write(b"Content-Type: text/event-stream\r\n\r\n6\r\ndata:1\r\n")
        await go_on.wait()
        writer.write(b"6\r\ndata:2\r\n0\r\n\r\n")

    async with RawServer(handler) as url:
        resp = await pool_for(pools, url).post("/", {}, b"", soon())
        assert resp.content_type == "text/event-stream"
        assert await resp.readany() == b"data:1"  # before the rest was even sent
        go_on.set()
        assert await resp.read() == b"data:2"
        resp.close()


async def test_a_body_without_length_ends_with_the_connection(pools: list[Http1Pool]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()

    server = RawServer(handler)
    async with server as url:
        pool = pool_for(pools, url)
        for _ in range(2):  # the second request needs a new connection
            resp = await pool.post("/", {}, b"", soon())
            assert await resp.read() == b"all of it"
            resp.close()
    assert server.connections == 2


async def test_a_compressed_answer_is_inflated(pools: list[Http1Pool]) -> None:
    packed = gzip.compress(b'{"text": "' + b"x" * 5000 + b'"}')

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(packed, "Content-Encoding: gzip"))

    async with RawServer(handler) as url:
        resp = await pool_for(pools, url).post("/", {}, b"", soon())
        assert await resp.read() == b'{"text": "' + b"x" * 5000 + b'"}'
        resp.close()


async def test_a_connection_the_server_dropped_while_idle_is_replaced(
    pools: list[Http1Pool],
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)  # one answer per connection, then a silent close
        writer.write(answer(b"one"))
        await writer.drain()

    server = RawServer(handler)
    async with server as url:
        pool = pool_for(pools, url)
        for _ in range(3):
            resp = await pool.post("/", {}, b"", soon())
            assert await resp.read() == b"one"
            resp.close()
            await asyncio.sleep(0)  # the server's close may or may not have arrived yet
    assert server.connections == 3


async def test_a_server_that_closes_before_answering_is_an_error(pools: list[Http1Pool]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with RawServer(handler) as url:
        with pytest.raises(Http1Error):
            await pool_for(pools, url).post("/", {}, b"", soon())


async def test_a_body_cut_short_is_an_error(pools: list[Http1Pool]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()

    async with RawServer(handler) as url:
        resp = await pool_for(pools, url).post("/", {}, b"", soon())
        with pytest.raises(Http1Error):
            await resp.read()
        resp.close()


async def test_garbage_is_an_error(pools: list[Http1Pool]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await asyncio.sleep(5)

    async with RawServer(handler) as url:
        with pytest.raises(Http1Error, match="malformed"):
            await pool_for(pools, url).post("/", {}, b"", soon())


async def test_an_abandoned_answer_does_not_go_back_to_the_pool(pools: list[Http1Pool]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")

    server = RawServer(handler)
    async with server as url:
        pool = pool_for(pools, url)
        for _ in range(2):
            resp = await pool.post("/", {}, b"", soon())
            assert await resp.readany() == b"half"
            resp.close()  # four bytes of ten read: this connection cannot serve another answer
    assert server.connections == 2


async def test_at_most_max_connections_then_requests_wait_for_one(pools: list[Http1Pool]) -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            await release.wait()
            writer.write(answer(b"ok"))

    server = RawServer(handler)
    async with server as url:
        pool = pool_for(pools, url, limit=2)

        async def one() -> bytes:
            resp = await pool.post("/", {}, b"", soon())
            try:
                return await resp.read()
            finally:
                resp.close()

        tasks = [asyncio.create_task(one()) for _ in range(5)]
        await asyncio.sleep(0.2)
        assert server.connections == 2 and not any(t.done() for t in tasks)
        release.set()
        assert await asyncio.gather(*tasks) == [b"ok"] * 5
    assert server.connections == 2


async def test_cancelling_a_waiting_request_closes_its_connection(pools: list[Http1Pool]) -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # until the client closes
        closed.set()

    async with RawServer(handler) as url:
        pool = pool_for(pools, url)
        task = asyncio.create_task(pool.post("/", {}, b"", soon()))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(closed.wait(), 5)


async def test_the_deadline_covers_the_headers_and_the_body(pools: list[Http1Pool]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _, _ = await read_request(reader)
        if line.startswith("POST /body"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        await reader.read()  # then silence, until the client closes

    server = RawServer(handler)
    async with server as url:
        pool = pool_for(pools, url)
        with pytest.raises(Http1Timeout):
            await pool.post("/head", {}, b"", soon(0.1))
        resp = await pool.post("/body", {}, b"", soon(0.2))
        with pytest.raises(Http1Timeout):
            await resp.read()
        resp.close()
        # a disarmed answer waits for its reader's own deadline instead
        resp = await pool.post("/body", {}, b"", soon(0.1))
        resp.disarm()
        await asyncio.sleep(0.2)
        assert await resp.readany() == b"half"
        resp.close()
    assert server.connections == 3  # a timed-out exchange never goes back to the pool


async def test_an_awaited_answer_is_polled_for_until_it_is_done_with(
    pools: list[Http1Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    yields: list[int] = []
    monkeypatch.setattr(busy_wait.os, "sched_yield", lambda: yields.append(1))
    more = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(0.01)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nhalf")
        await more.wait()
        writer.write(b"half")
        await reader.read()

    async with RawServer(handler) as url:
        pool = pool_for(pools, url)
        resp = await pool.post("/", {}, b"", soon())
        assert yields, "the loop slept instead of polling for the answer"
        assert pool.busy.waiting == 1  # the body is still to come
        more.set()
        assert await resp.read() == b"halfhalf"
        assert pool.busy.waiting == 1  # until the answer is done with
        resp.close()
        assert pool.busy.waiting == 0
        spun = len(yields)
        await asyncio.sleep(0.1)  # nothing awaited: the loop sleeps again
        assert len(yields) <= spun + 1


async def test_connect_errors() -> None:
    refused = Http1Pool("http://127.0.0.1:1/v1", {}, connect_timeout_s=2.0, max_connections=1)
    with pytest.raises(Http1Error, match="cannot connect"):
        await refused.post("/", {}, b"", soon())
    with pytest.raises(ValueError):
        Http1Pool("ftp://x/v1", {}, connect_timeout_s=1.0, max_connections=1)
    assert issubclass(ConnectTimeout, Http1Error)  # a connect timeout: test_openai_upstream.py


def test_the_same_under_uvloop() -> None:
    """The gateway serves on uvloop, whose transports are not asyncio's classes."""
    uvloop = pytest.importorskip("uvloop")

    async def scenarios() -> None:
        pools: list[Http1Pool] = []
        try:
            await test_post_sends_the_body_and_reuses_the_connection(pools)
            await test_chunked_streams_arrive_as_they_are_sent(pools)
            await test_a_body_cut_short_is_an_error(pools)
            await test_at_most_max_connections_then_requests_wait_for_one(pools)
        finally:
            for pool in pools:
                pool.close()

    uvloop.run(scenarios())
