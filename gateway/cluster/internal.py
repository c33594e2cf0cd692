"""The internal engine endpoint: peers (and same-host workers) run prompts on this node's engine.

Authenticated by the shared node secret in `x-node-secret` (compared in constant time); user
API keys never open it, and it exists only where an engine is served to others: a cluster node
(`cluster.enabled`), or worker 0 of `[server] workers` > 1 (gateway/engine_host/worker_share.py),
which serves it on `cluster.internal_socket` only. No admission, usage or
parsing here: the process the client reached does all of that. The answer streams RequestOutputs
as JSON lines (providers/local/remote_engine.py); a client that goes away aborts the request.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections.abc import AsyncIterator

from aiohttp import web

from backend.engine.interface import (
    EngineClosed,
    EngineError,
    EngineOverloaded,
    RequestOutput,
)
from backend.engine.sampling_params import SamplingParams
from gateway.cluster.node import ClusterNode
from gateway.errors import AuthenticationError, InvalidRequest, NotFound, ServiceUnavailable
from gateway.resources import CLUSTER, ENGINE_HOST, SETTINGS, EngineHost
from gateway.server.request_body import read_body
from plumbing import jsoncodec
from providers.local.remote_engine import (
    GENERATE_PATH,
    SECRET_HEADER,
    output_to_json,
    params_from_json,
)

STATUS_PATH = "/internal/cluster"


def check_secret(request: web.Request, secret: str) -> None:
    """Raise 401 unless the caller sent `secret` (an empty one opens nothing)."""
    given = request.headers.get(SECRET_HEADER, "")
    if not secret or not hmac.compare_digest(given.encode(), secret.encode()):
        raise AuthenticationError(
            "This endpoint takes the cluster node secret.", code="bad_node_secret"
        )


def engine_host(request: web.Request) -> EngineHost:
    """Who serves the engine here, once the caller proved it knows the secret."""
    host = request.app.get(ENGINE_HOST)
    if host is None or (host.unix_only and not _on_unix_socket(request)):
        raise NotFound("Not found")
    check_secret(request, host.secret)
    return host


def _on_unix_socket(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and isinstance(transport.get_extra_info("sockname"), str)


def _node(request: web.Request) -> ClusterNode:
    """This node, once the caller proved it knows the node secret."""
    node = request.app.get(CLUSTER)
    if node is None:
        raise NotFound("Not found")
    check_secret(request, node.secret)
    return node


async def status(request: web.Request) -> web.Response:
    """What this node's index holds: the live nodes, their load and how many blocks each."""
    node = _node(request)
    placer = node.placer
    nodes: dict[str, dict[str, object]] = {}
    if placer is not None:
        follower = placer.follower
        for node_id, record in follower.live(time.monotonic()).items():
            nodes[node_id] = {
                "url": record.url,
                "blocks": follower.index.num_blocks(node_id),
                "position": follower.index.position(node_id),
                "waiting": record.waiting,
                "running_tokens": record.running_tokens,
                "free_blocks": record.free_blocks,
            }
    body = {"node": node.node_id, "url": node.url, "nodes": nodes}
    return web.Response(body=jsoncodec.dumps(body), content_type="application/json")


async def generate(request: web.Request) -> web.StreamResponse:
    """Run one prompt on this node's engine. A request refused before it was queued gets its
    error status; a queued one gets 200 within `cluster.forward_keepalive_s`, then its outputs,
    with an empty line whenever nothing was written for that long (the client's deadlines tell
    a silent peer from a slow prefill)."""
    engine = engine_host(request).engine
    if engine is None:
        raise ServiceUnavailable("This node serves no local engine.", code="no_engine")
    settings = request.app[SETTINGS]
    request_id, prompt_ids, params = _parse(
        await read_body(request, settings.server.request_body_timeout_s)
    )
    keepalive_s = settings.cluster.forward_keepalive_s
    outputs = engine.generate(request_id, prompt_ids, params)
    # The engine refuses a request (bad prompt, full queue, closed) on its first step, before
    # any await; a next output still pending after `keepalive_s` belongs to a queued request.
    pending = asyncio.ensure_future(_next(outputs))
    try:
        await asyncio.wait((pending,), timeout=keepalive_s)
        if pending.done():
            try:
                pending.result()
            except ValueError as exc:
                raise InvalidRequest(str(exc), param="prompt_ids") from None
            except EngineOverloaded as exc:
                retry = str(max(1, math.ceil(exc.retry_after_s)))
                raise ServiceUnavailable(
                    str(exc), code="overloaded", headers={"Retry-After": retry}
                ) from None
            except (EngineClosed, EngineError) as exc:
                raise ServiceUnavailable(str(exc), code="engine_unavailable") from None
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        while True:
            if not pending.done():
                await asyncio.wait((pending,), timeout=keepalive_s)
                if not pending.done():
                    await resp.write(b"\n")  # still working: the client keeps waiting
                    continue
            try:
                output = pending.result()
            except (EngineClosed, EngineError) as exc:
                await resp.write(jsoncodec.dumps({"error": str(exc)}) + b"\n")
                break
            if output is None:
                break
            await resp.write(output_to_json(output))
            pending = asyncio.ensure_future(_next(outputs))
        return resp
    finally:
        if not pending.done():
            pending.cancel()  # the generator aborts the engine request
            await asyncio.wait((pending,))
        if not pending.cancelled():
            pending.exception()  # retrieved: raised above, or nothing more to say
        await outputs.aclose()


async def _next(outputs: AsyncIterator[RequestOutput]) -> RequestOutput | None:
    """The next output; None at the end."""
    return await anext(outputs, None)


def _parse(raw: bytes) -> tuple[str, list[int], SamplingParams]:
    try:
        body = jsoncodec.loads(raw)
        request_id = body["request_id"]
        prompt_ids = body["prompt_ids"]
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id must be a non-empty string")
        if not isinstance(prompt_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt_ids
        ):
            raise ValueError("prompt_ids must be a list of integers")
        params = params_from_json(body.get("params", {}))
    except (jsoncodec.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"Bad internal generate request: {exc}") from None
    return request_id, prompt_ids, params


def routes() -> list[web.RouteDef]:
    return [web.post(GENERATE_PATH, generate), web.get(STATUS_PATH, status)]
