"""A hostile upstream behind the live gateway: an answer the HTTP client refuses (too many
headers, an encoding it does not decode, a decompression bomb) reaches the client as a 502 in
OpenAI's error JSON, never a 500; an informational answer before the real one is served."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from testkit.gateway_app import gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream

ANSWER = json.dumps(
    {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }
).encode()


def reply_for(model: str) -> bytes:
    """What the hostile upstream sends for a request for `model`."""
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json"]
    body = ANSWER
    if model == "many-headers":
        head += [f"X-H{i}: {i}" for i in range(200)]
    elif model == "brotli":
        head.append("Content-Encoding: br")
    elif model == "bomb":
        head.append("Content-Encoding: gzip")
        body = gzip.compress(bytes(80 << 20), compresslevel=1)
    head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.partition(b":")[2])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            model = json.loads(await reader.readexactly(length))["model"]
            if model == "early-hints":  # sent at once; the answer when it is ready
                writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.05)
            writer.write(reply_for(model))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def root(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[str]:
    hostile = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = hostile.sockets[0].getsockname()[1]
    provider = {
        "kind": "openai",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "direct_models": ["*"],
    }
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        auth={"enabled": False},
        providers={"hostile": provider},
        models={},
    )
    runner, url = await start_gateway(settings)
    try:
        yield url
    finally:
        await runner.cleanup()
        hostile.close()


async def ask(root: str, model: str) -> tuple[int, dict[str, object]]:
    body = {"model": f"hostile/{model}", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{root}/v1/chat/completions", json=body) as resp,
    ):
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("many-headers", "more than 128 header fields"),
        ("brotli", "encoded as 'br'"),
        ("bomb", "decompresses to more than 67108864 bytes"),
    ],
)
async def test_a_refused_answer_is_a_502_in_openai_error_json(
    root: str, model: str, reason: str
) -> None:
    status, body = await ask(root, model)
    assert status == 502, body
    error = body["error"]
    assert isinstance(error, dict)
    assert error["code"] == "upstream_unavailable"
    assert error["message"].startswith("Provider 'hostile' sent an answer the gateway refuses")
    assert reason in error["message"]


async def test_an_early_hints_answer_before_the_real_one_is_served(root: str) -> None:
    status, body = await ask(root, "early-hints")
    assert status == 200, body
    choices = body["choices"]
    assert isinstance(choices, list)
    assert choices[0]["message"]["content"] == "hi"
