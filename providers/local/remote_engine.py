"""An engine in another process, reached over its internal HTTP endpoint: the same
`generate` contract as `AsyncEngine`, so the local provider serves through either.

Wire: `POST {base}/internal/engine/generate` with header `x-node-secret` and a JSON body
`{"request_id", "prompt_ids", "params"}` (SamplingParams' fields); the answer streams one JSON
object per line, a RequestOutput each (`{"error": ...}` if the engine fails mid-way). Before
anything is generated the endpoint answers 400 (bad prompt or params), 503 with `Retry-After`
and code "overloaded" (queue full), or another 5xx (engine closed). Once the request is queued
it answers 200 within its keep-alive interval, and writes an empty line whenever it wrote
nothing for that long, so silence means a frozen or unreachable peer, not a slow prefill.
`base` is `http://host:port` of a peer node, or `unix:/path/to.sock` for a process on the same
host. Closing the iterator closes the connection, which aborts the request over there.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import asdict, fields
from typing import Any

import aiohttp

from backend.engine.interface import (
    EngineClosed,
    EngineError,
    EngineOverloaded,
    RequestOutput,
    TokenLogprobs,
)
from backend.engine.request import FinishReason
from backend.engine.sampling_params import SamplingParams
from plumbing.record import record

GENERATE_PATH = "/internal/engine/generate"
SECRET_HEADER = "x-node-secret"
_PARAM_FIELDS = {f.name for f in fields(SamplingParams)}
_TUPLE_PARAMS = ("stop", "stop_token_ids", "grammar_after")


class PeerUnreachable(EngineClosed):
    """The peer could not be reached, or failed before generating anything."""


@record
class ForwardDeadlines:
    """How long a peer may stay silent: until its answer begins (`first_byte_s`, from the
    request's send, a kept-alive connection's too), and between two lines (`idle_s`)."""

    first_byte_s: float
    idle_s: float


def params_to_json(params: SamplingParams) -> dict[str, Any]:
    return asdict(params)


def params_from_json(data: Any) -> SamplingParams:
    """Raises ValueError for anything SamplingParams would not accept."""
    if not isinstance(data, dict) or not set(data) <= _PARAM_FIELDS:
        raise ValueError("params must be an object of SamplingParams fields")
    values = dict(data)
    for name in _TUPLE_PARAMS:
        if name in values:
            values[name] = tuple(values[name])
    try:
        return SamplingParams(**values)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def output_to_json(output: RequestOutput) -> bytes:
    data: dict[str, Any] = {
        "new_token_ids": output.new_token_ids,
        "finished": output.finished,
        "finish_reason": output.finish_reason,
        "num_prompt_tokens": output.num_prompt_tokens,
        "num_cached_tokens": output.num_cached_tokens,
    }
    if output.logprobs is not None:
        data["logprobs"] = [[lp.logprob, lp.top] for lp in output.logprobs]
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def output_from_json(request_id: str, data: dict[str, Any]) -> RequestOutput:
    raw = data.get("logprobs")
    logprobs = None
    if raw is not None:
        logprobs = [
            TokenLogprobs(float(lp), [(int(t), float(v)) for t, v in top]) for lp, top in raw
        ]
    reason: FinishReason | None = data["finish_reason"]
    return RequestOutput(
        request_id=request_id,
        new_token_ids=[int(t) for t in data["new_token_ids"]],
        finished=bool(data["finished"]),
        finish_reason=reason,
        num_prompt_tokens=int(data["num_prompt_tokens"]),
        num_cached_tokens=int(data["num_cached_tokens"]),
        logprobs=logprobs,
    )


def split_base(base: str) -> tuple[str, str | None]:
    """The URL root to post to and, for `unix:/path`, the socket path (the session must then
    use `aiohttp.UnixConnector(path=...)`)."""
    if base.startswith("unix:"):
        return "http://localhost", base.removeprefix("unix:")
    return base.rstrip("/"), None


class RemoteEngine:
    """Client of one peer's engine endpoint over `session` (shared by the app); without
    `deadlines` it waits for the peer as long as it takes."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        root: str,
        secret: str,
        deadlines: ForwardDeadlines | None = None,
    ) -> None:
        self._session = session
        self._url = root + GENERATE_PATH
        self._secret = secret
        self._first_byte_s = deadlines.first_byte_s if deadlines else None
        self._idle_s = deadlines.idle_s if deadlines else None

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncGenerator[RequestOutput, None]:
        """Like `AsyncEngine.generate`; raises PeerUnreachable when nothing was generated
        because the peer was not there, or went silent or failed before its first output (the
        caller may serve the request elsewhere), and EngineError when it did so later."""
        body = {
            "request_id": request_id,
            "prompt_ids": list(prompt_ids),
            "params": params_to_json(params),
        }
        try:
            async with asyncio.timeout(self._first_byte_s):
                resp = await self._session.post(
                    self._url, json=body, headers={SECRET_HEADER: self._secret}
                )
        except TimeoutError:
            raise PeerUnreachable(
                f"peer engine sent nothing within {_seconds(self._first_byte_s)}"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise PeerUnreachable(f"peer engine unreachable: {exc}") from None
        async with resp:
            if resp.status != 200:
                try:
                    async with asyncio.timeout(self._idle_s):
                        await _raise_for(resp)
                except TimeoutError:
                    raise PeerUnreachable(
                        f"peer engine answered {resp.status}, then nothing for "
                        f"{_seconds(self._idle_s)}"
                    ) from None
            generated = finished = False
            try:
                while True:
                    async with asyncio.timeout(self._idle_s):
                        line = await resp.content.readline()
                    if not line:
                        break
                    if not line.strip():
                        continue  # the peer's keep-alive
                    data = json.loads(line)
                    if "error" in data:
                        failed = PeerUnreachable if not generated else EngineError
                        raise failed(f"peer engine failed: {data['error']}")
                    output = output_from_json(request_id, data)
                    generated, finished = True, output.finished
                    yield output
                    if finished:
                        return
            except TimeoutError:
                silent = f"peer engine sent nothing for {_seconds(self._idle_s)}"
                raise (EngineError if generated else PeerUnreachable)(silent) from None
            except (aiohttp.ClientError, OSError) as exc:
                lost = f"peer engine connection lost: {exc}"
                raise (EngineError if generated else PeerUnreachable)(lost) from None
            finally:
                if not finished:
                    resp.close()  # the connection goes: the peer aborts the request
            if not finished:
                early = "peer engine closed the stream early"
                raise (EngineError if generated else PeerUnreachable)(early)

    def finish(self, request_id: str, reason: FinishReason = "stop") -> None:
        """Nothing to send: the caller closes the stream next, which ends the remote request."""


def _seconds(limit: float | None) -> str:
    return "its read timeout" if limit is None else f"{limit:g}s"


async def _raise_for(resp: aiohttp.ClientResponse) -> None:
    try:
        payload = await resp.json(content_type=None)
        message = str(payload["error"]["message"])
        code = payload["error"].get("code")
    except (ValueError, KeyError, TypeError, aiohttp.ClientError):
        message, code = f"peer answered {resp.status}", None
    if resp.status == 400:
        raise ValueError(message)
    if code == "overloaded":
        raise EngineOverloaded(float(resp.headers.get("Retry-After", "1")))
    raise PeerUnreachable(f"peer engine answered {resp.status}: {message}")
