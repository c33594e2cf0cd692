"""An upstream's model list and health check: GET /models over the provider's
`aiohttp.ClientSession` (the chat calls go over its `Http1Pool`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp

from providers.base import ModelCard
from providers.errors import ProviderError, UpstreamTimeout, UpstreamUnavailable
from providers.upstream.errors import describe


async def list_models(
    session: aiohttp.ClientSession,
    url: str,
    provider: str,
    timeout_s: float,
    http_error: Callable[[aiohttp.ClientResponse], Awaitable[ProviderError]],
    timeout_error: Callable[[str], UpstreamTimeout],
) -> list[ModelCard]:
    """The models the upstream lists (`owned_by` the provider where it says none)."""
    try:
        async with asyncio.timeout(timeout_s), session.get(url) as resp:
            if resp.status >= 400:
                raise await http_error(resp)
            payload = await resp.json(content_type=None)
    except TimeoutError:
        raise timeout_error("models") from None
    except (aiohttp.ClientError, ValueError) as exc:
        raise UpstreamUnavailable(
            f"Provider '{provider}' could not list its models.",
            provider=provider,
            detail=describe(exc),
        ) from exc
    return [
        ModelCard(str(m["id"]), str(m.get("owned_by") or provider), int(m.get("created") or 0))
        for m in payload.get("data") or ()
        if isinstance(m, dict) and "id" in m
    ]


async def answers_ok(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    """True when GET `url` answers 200 within `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s), session.get(url) as resp:
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False
