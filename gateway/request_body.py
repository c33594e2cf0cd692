"""A request's body, read within `timeout_s` of its head (`server.request_body_timeout_s`): a
client that sends its body slowly, or never, gets a 408 instead of holding a handler and a
connection for good."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.errors import RequestTimeout


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    if request.content.is_eof():  # it all came with the head: nothing to wait for, no timer
        return await request.read()
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout_s:g} s of its headers."
        ) from None
