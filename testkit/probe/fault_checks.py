"""Faults: an upstream that breaks the protocol, slow clients, many clients leaving mid-stream on
every protocol, Redis paused (SIGSTOP) and killed mid-stream. After each, every request has its
usage record and the key holds nothing."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from testkit.probe.results import Results, answer_problem
from testkit.probe.stage import SLOW_CLIENT_S, Stage
from testkit.rawhttp import exchange, parse_answer, request_bytes

ASK = "alpha beta gamma delta"
PROTOCOLS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": ASK}]},
    "/v1/completions": {"prompt": ASK},
    "/v1/responses": {"input": ASK},
    "/v1/messages": {"messages": [{"role": "user", "content": ASK}], "max_tokens": 200},
}
BROKEN = ("html", "garbled", "overcount", "nochoices", "reset", "retry-inf")


def request(stage: Stage, path: str, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {stage.key}", "Content-Type": "application/json"}
    headers["Content-Length"] = str(len(raw))
    return request_bytes("POST", path, headers, raw)


async def until(check: Callable[[], Awaitable[bool]], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def settled(stage: Stage, records: int, within_s: float = 30) -> str | None:
    """None once the key holds nothing and the usage log has `records` entries."""

    async def done() -> bool:
        return await stage.held() == (0, 0) and len(await stage.statuses()) >= records

    if await until(done, within_s):
        return None
    return f"held {await stage.held()}, {len(await stage.statuses())} of {records} records"


async def leave_mid_stream(
    stage: Stage, path: str, body: dict[str, Any], leave: asyncio.Event | None
) -> bytes:
    """A streamed request on a raw connection, reset once the first event came and `leave` is
    set; read to its end when `leave` is None. Returns what was read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", stage.port)
    seen = b""
    try:
        writer.write(request(stage, path, {**body, "stream": True}))
        async with asyncio.timeout(60):
            if leave is None:
                return await reader.read()
            while b"data:" not in seen:
                chunk = await reader.read(4096)
                if not chunk:
                    return seen
                seen += chunk
            await leave.wait()
    finally:
        writer.transport.abort()
    return seen


async def broken_upstream(stage: Stage, results: Results) -> None:
    for behaviour in BROKEN:
        for provider in ("broken", "brokenstream"):
            for path, body in PROTOCOLS.items():
                for stream in (False, True):

                    async def check(
                        path: str = path,
                        body: dict[str, Any] = body,
                        stream: bool = stream,
                        model: str = f"{provider}/{behaviour}",
                    ) -> str | None:
                        before = len(await stage.statuses())
                        answer = await exchange(
                            stage.root,
                            request(stage, path, {**body, "model": model, "stream": stream}),
                            deadline_s=30,
                        )
                        if (
                            answer.status == 200 and stream
                        ):  # failed after the headers: in the stream
                            failed = b"error" in answer.body or b"response.failed" in answer.body
                            problem = (
                                None
                                if failed
                                else f"a 200 stream without an error: {answer.body[-200:]!r}"
                            )
                        else:
                            want = 429 if model.endswith("retry-inf") else 502
                            problem = answer_problem(
                                answer.status,
                                answer.headers,
                                answer.body,
                                path,
                                upstream_failed=True,
                            )
                            if problem is None and answer.status != want:
                                problem = f"HTTP {answer.status}, expected {want}"
                        return problem or await settled(stage, before + 1)

                    name = f"{provider}/{behaviour} {path}{' stream' if stream else ''}"
                    await results.run("upstream", name, check, within_s=40)


async def slow_clients(stage: Stage, results: Results) -> None:
    async def closed(sent: bytes) -> str | None:
        reader, writer = await asyncio.open_connection("127.0.0.1", stage.port)
        try:
            writer.write(sent)
            async with asyncio.timeout(SLOW_CLIENT_S + 10):
                data = await reader.read()
        finally:
            writer.close()
        return None if data == b"" else f"answered {data[:100]!r}"

    await results.run("slow", "idle connection is closed", lambda: closed(b""), within_s=20)
    await results.run(
        "slow",
        "half a head is closed",
        lambda: closed(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n"),
        within_s=20,
    )

    async def stalled_reader() -> str | None:
        before = len(await stage.statuses())
        body = {
            "model": "mock/echo-chunks-6000",
            "messages": [{"role": "user", "content": "x" * 2000}],
            "stream": True,
        }
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, never read
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", stage.port))
            await loop.sock_sendall(sock, request(stage, "/v1/chat/completions", body))
            return await settled(stage, before + 1, within_s=SLOW_CLIENT_S + 30)
        finally:
            sock.close()

    await results.run("slow", "a stream nobody reads frees its slot", stalled_reader, within_s=60)


async def disconnects(stage: Stage, results: Results) -> None:
    async def storm() -> str | None:
        before = len(await stage.statuses())
        leave = asyncio.Event()
        calls = [
            leave_mid_stream(stage, path, {**body, "model": model, "max_tokens": 300}, leave)
            for model in ("deepseek-chat", "slow")
            for path, body in PROTOCOLS.items()
            for _ in range(3)
        ]
        tasks = [asyncio.ensure_future(c) for c in calls]
        await asyncio.sleep(1.0)
        leave.set()
        await asyncio.gather(*tasks)
        return await settled(stage, before + len(calls), within_s=60)

    await results.run(
        "disconnect", "24 clients leave mid-stream on 4 protocols", storm, within_s=120
    )


async def redis_outages(stage: Stage, results: Results) -> None:
    for fault in ("paused", "killed"):

        async def outage(fault: str = fault) -> str | None:
            before = len(await stage.statuses())
            leave = asyncio.Event()
            tasks = [
                asyncio.ensure_future(
                    leave_mid_stream(stage, path, {**body, "model": "slow"}, left)
                )
                for path, body in PROTOCOLS.items()
                for left in (None, leave)
            ]

            async def admitted() -> bool:
                return (await stage.held())[0] == len(tasks)

            if not await until(admitted, 20):
                return f"not all admitted: held {await stage.held()}"
            if fault == "paused":
                stage.redis.pause()
            else:
                stage.redis.stop()
            leave.set()
            answers = await asyncio.gather(*tasks)
            if fault == "paused":
                stage.redis.resume()
            else:
                stage.redis.start()
                await stage.client.connection_pool.disconnect()
            finished = [
                a for a in answers if a.startswith(b"HTTP/1.1 200") and a.endswith(b"\r\n\r\n")
            ]
            problem = await settled(stage, before + len(tasks), within_s=60)
            return problem or (
                None if len(finished) == len(tasks) // 2 else f"{len(finished)} finished"
            )

        await results.run(
            "redis", f"{fault} mid-stream, half the clients leave", outage, within_s=120
        )
        await asyncio.sleep(1)

    async def recovered() -> str | None:
        answer = parse_answer(
            await leave_mid_stream(
                stage, "/v1/messages", {**PROTOCOLS["/v1/messages"], "model": "echo"}, None
            )
        )
        return None if answer.status == 200 else f"HTTP {answer.status}"

    await results.run("redis", "serves again afterwards", recovered, within_s=30)


async def run(stage: Stage, results: Results) -> None:
    await broken_upstream(stage, results)
    await slow_clients(stage, results)
    await disconnects(stage, results)
    await redis_outages(stage, results)
