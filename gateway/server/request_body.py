"""A request's body, read within `timeout_s` of its head (`server.request_body_timeout_s`): a
client that sends its body slowly, or never, gets a 408 instead of holding a handler and a
connection for good."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.errors import PayloadTooLarge, RequestTimeout


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, once (it is not kept for a second read)."""
    content = request.content
    if content.is_eof():  # it all came with the head: taken as it lies, no timer, no await
        raw = content.read_nowait()
        if len(raw) > request.client_max_size:  # a chunked body, whose size nothing declared
            raise PayloadTooLarge("The request body is too large.")
        return raw
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout_s:g} s of its headers."
        ) from None
