"""An upstream that speaks the OpenAI API (TaoToken, DeepSeek, OpenAI, vLLM, SGLang).

Chat and completions requests go over the provider's `Http1Pool` (providers/transport/http1.py: a
lean HTTP/1.1 client; aiohttp's client cost as much CPU per request as the gateway's whole server
side); `/models` and health checks over an `aiohttp.ClientSession`. Both are opened by `open()`
(or on first use) and closed by `close()`. A streaming client's request is streamed from the
upstream; a client that asked for one JSON body gets one from the upstream too, unless
`stream_upstream` is set.

Why: each chunk of a streamed answer costs a read, an SSE parse and a JSON decode (a third of
the gateway's CPU per request on 20-chunk answers); what streaming bought a JSON client is a
sooner verdict on a stalled upstream (idle and first-byte timeouts). A JSON answer must instead
be complete within `answer_timeout_s` (600 s, the openai SDKs' own default timeout).

Timeouts: `connect_timeout_s` for the TCP/TLS connect; `first_byte_timeout_s` from sending the
request until the first SSE data frame (keep-alive comments do not count: a queue that never
serves us is a failure the router can route around); `idle_timeout_s` between reads after that;
`answer_timeout_s` from sending a non-streamed request until its whole answer is read.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

import aiohttp

from plumbing import jsoncodec
from plumbing.busy_wait import BusyWait
from providers.base import ModelCard
from providers.errors import (
    ProviderError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from providers.transport.http1 import (
    AnswerLimits,
    ConnectTimeout,
    Http1Error,
    Http1Pool,
    Http1Refused,
    Http1Response,
    Http1Timeout,
    Proxy,
)
from providers.transport.read_deadline import ReadDeadline
from providers.transport.sse import SSEEvent, SSEParser
from providers.types import ChatRequest, Event, Placed
from providers.upstream.affinity import conversation_key, pick
from providers.upstream.config import UpstreamConfig
from providers.upstream.errors import (
    broken_error,
    clip,
    describe,
    http_error,
    refused_error,
    timeout_error,
    unreachable_error,
    unreadable_error,
)
from providers.upstream.model_listing import answers_ok, list_models
from providers.upstream.openai_wire import (
    ChunkDecoder,
    StreamDecoder,
    build_body,
    error_message,
    fim_url,
)

# How long to wait, after `[DONE]`, for the end of the body before closing the connection.
_DRAIN_TIMEOUT_S = 1.0
_NO_HEADERS: Mapping[str, str] = {}


class OpenAIUpstream:
    """The Provider for one OpenAI-compatible upstream. `busy`: the serving process's
    `BusyWait`, which waits for the upstream's answers (default: none, always sleep)."""

    def __init__(self, config: UpstreamConfig, *, busy: BusyWait | None = None) -> None:
        self.name = config.name
        self._config = config
        self._busy = busy
        base = config.base_url.rstrip("/")
        self._chat_url = base + "/chat/completions"
        self._completions_url = base + "/completions"
        self._fim_url = fim_url(base, config.fim)
        self._models_url = base + "/models"
        self._paths: dict[str, str] = {}  # URL -> its request target on the pool's origin
        self._session: aiohttp.ClientSession | None = None
        self._pool: Http1Pool | None = None
        self._closed = False

    @property
    def supports_fim(self) -> bool:
        """Whether it takes fill-in-the-middle requests (`ChatRequest.suffix`): the router
        skips it for them otherwise."""
        return self._config.fim != "none"

    async def open(self) -> None:
        self._open_pool()
        self._open_session()

    async def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise UpstreamUnavailable(
                f"Provider '{self.name}' is shutting down.", provider=self.name
            )

    def _open_pool(self) -> Http1Pool:
        if self._pool is None:
            self._refuse_if_closed()
            config = self._config
            headers = {"Content-Type": "application/json", **self._auth_headers()}
            headers.update(config.headers)
            self._pool = Http1Pool(
                config.base_url,
                headers,
                connect_timeout_s=config.connect_timeout_s,
                max_connections=config.max_connections,
                busy=self._busy,
                limits=AnswerLimits(
                    config.max_answer_headers,
                    config.max_header_field_bytes,
                    config.max_answer_bytes,
                ),
                idle_expiry_s=config.pool_idle_timeout_s,
                keepalive_s=config.tcp_keepalive_s,
                proxy=Proxy.parse(config.proxy) if config.proxy else None,
                ssl_context=self._tls(),
            )
        return self._pool

    def _tls(self) -> ssl.SSLContext | None:
        """The trust for an https upstream: `ca_file`'s authorities, else the system's (None)."""
        if self._config.ca_file is None:
            return None
        return ssl.create_default_context(cafile=self._config.ca_file)

    def _open_session(self) -> aiohttp.ClientSession:
        self._refuse_if_closed()
        if self._session is None:
            config = self._config
            headers = self._auth_headers()
            headers.update(config.headers)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    ssl=self._tls() or True,
                    limit=config.max_connections,
                    keepalive_timeout=config.pool_idle_timeout_s,
                ),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s),
                headers=headers,
                # The proxy the gateway resolved (the environment's, or the provider's own):
                # the same as the chat calls', credentials from its URL.
                proxy=config.proxy,
                # No cookies: one session serves every user, and the jar costs a filter pass
                # on every request.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    def _auth_headers(self) -> dict[str, str]:
        key = self._config.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _request(self, request: ChatRequest, stream: bool) -> tuple[str, dict[str, Any]]:
        """The URL and JSON body for `request`."""
        body = build_body(
            request,
            thinking_style=self._config.thinking_style,
            send_reasoning_history=self._config.send_reasoning_history,
            stream=stream,
        )
        if request.prompt is None:
            return self._chat_url, body
        return self._fim_url if request.suffix is not None else self._completions_url, body

    def _decoder(self) -> StreamDecoder:
        return ChunkDecoder(self.name)

    async def chat(self, request: ChatRequest) -> AsyncGenerator[Event, None]:
        config = self._config
        streamed = config.stream_upstream or request.stream
        url, body = self._request(request, streamed)
        loop = asyncio.get_running_loop()
        now = loop.time()
        total_by = now + config.total_timeout_s  # the whole answer, comments or not
        deadline = now + (config.first_byte_timeout_s if streamed else config.answer_timeout_s)
        waiting_for = "first byte" if streamed else "answer"
        if total_by < deadline:
            deadline, waiting_for = total_by, "total"
        headers, placement = self._account(request)
        if placement is not None:
            yield Placed(placement)
        resp = await self._post(url, body, deadline, headers, waiting_for)
        reads = ReadDeadline()
        try:  # closing a fully read response leaves its connection in the pool
            if streamed:
                resp.disarm()  # the reads below keep their own deadlines
            if resp.status >= 400:
                raise await self._http_error(resp)
            decoder = self._decoder()
            out: list[Event] = []
            if resp.content_type != "text/event-stream":
                # A JSON answer to a streamed request: its body is read like one chunk.
                # Non-streamed: read by the answer deadline, still armed.
                by = min(deadline + config.idle_timeout_s, total_by) if streamed else None
                what = "total" if by == total_by else "idle" if streamed else waiting_for
                answer = await self._read_json(resp, by, what)
                self._decode(decoder.feed, answer, out, "answer")
                if not decoder.finished:
                    raise unreadable_error(
                        self.name, "answer", f"not an answer: {clip(str(answer))!r}"
                    )
                decoder.end(out)
                for event in out:
                    yield event
                return
            parser = SSEParser()
            # The next data event is due by `data_by` (comments do not count): the first within
            # the first-byte timeout, each later one within the idle timeout of the one before;
            # and the whole answer by `total_by`.
            data_by, idle_s = deadline, config.idle_timeout_s
            while True:
                if data_by < total_by:
                    chunk = await self._read_chunk(resp, reads, data_by, waiting_for)
                else:
                    chunk = await self._read_chunk(resp, reads, total_by, "total")
                frames = parser.feed(chunk) if chunk else parser.flush()
                if frames:
                    data_by, waiting_for = loop.time() + idle_s, "idle"
                failure: ProviderError | None = None
                try:
                    done = self._frames(frames, decoder, out)
                except ProviderError as exc:
                    failure, done = exc, False  # raised after the events decoded before it
                ended = done or not chunk
                if ended and failure is None:
                    if done or decoder.finished:
                        decoder.end(out)
                    else:
                        failure = broken_error(self.name, None)
                for event in out:
                    yield event
                out.clear()
                if failure is not None:
                    raise failure
                if ended:
                    if chunk:
                        await self._drain(resp, reads)
                    return
        finally:
            reads.close()
            resp.close()

    async def _read_chunk(
        self, resp: Http1Response, reads: ReadDeadline, timeout_at: float, waiting_for: str
    ) -> bytes:
        """The next body bytes (b"" at the end), by `timeout_at` (else the `waiting_for`
        timeout)."""
        try:
            return await reads.read(resp.readany(), timeout_at)
        except TimeoutError:
            raise self._timeout(waiting_for) from None
        except Http1Error as exc:
            raise broken_error(self.name, exc) from exc

    async def _drain(self, resp: Http1Response, reads: ReadDeadline) -> None:
        """After `[DONE]`: reads to the end of the body within `_DRAIN_TIMEOUT_S` (on the
        response's one read timer), so the connection can be reused."""
        deadline = asyncio.get_running_loop().time() + _DRAIN_TIMEOUT_S
        try:
            while await reads.read(resp.readany(), deadline):
                pass
        except (TimeoutError, Http1Error):
            pass  # the connection is closed instead

    def _frames(self, frames: list[SSEEvent], decoder: StreamDecoder, out: list[Event]) -> bool:
        """Decodes SSE frames into `out`; True when `[DONE]` was among them."""
        for frame in frames:
            data = frame.data
            if data == "[DONE]":
                return True
            try:
                chunk = jsoncodec.loads(data)
            except ValueError:
                chunk = None
            if frame.event == "error":
                raise UpstreamUnavailable(
                    f"Provider '{self.name}' reported an error while answering: "
                    + clip(error_message(chunk) if chunk is not None else data),
                    provider=self.name,
                )
            if not isinstance(chunk, dict):
                raise unreadable_error(self.name, "stream", f"malformed chunk: {data[:200]!r}")
            self._decode(decoder.feed, chunk, out, "stream")
        return False

    def _decode(
        self,
        feed: Callable[[dict[str, Any], list[Event]], None],
        chunk: dict[str, Any],
        out: list[Event],
        what: str,
    ) -> None:
        """`feed(chunk, out)`, where a chunk whose fields have the wrong types or values (a
        number for text, a usage count beyond any answer) is the upstream's fault: a 502."""
        try:
            feed(chunk, out)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            raise unreadable_error(
                self.name, what, f"{describe(exc)} in {clip(str(chunk))!r}"
            ) from None

    def _account(self, request: ChatRequest) -> tuple[Mapping[str, str], str | None]:
        """The headers of the account the request goes to, when there are several (else the
        session's), and that choice in words ("account=2/3")."""
        accounts = self._config.accounts
        if len(accounts) < 2:
            return _NO_HEADERS, None
        i = request.account
        if i is None or not 0 <= i < len(accounts):
            i = pick([name for name, _ in accounts], conversation_key(request))
        return {"Authorization": f"Bearer {accounts[i][1]}"}, f"account={i + 1}/{len(accounts)}"

    async def _post(
        self,
        url: str,
        body: dict[str, Any],
        deadline: float,
        headers: Mapping[str, str],
        waiting_for: str,
    ) -> Http1Response:
        """The response's status and headers, by `deadline` (else the `waiting_for` timeout)."""
        pool = self._open_pool()
        path = self._paths.get(url) or self._paths.setdefault(url, pool.path_of(url))
        try:
            return await pool.post(path, headers, jsoncodec.dumps(body), deadline)
        except ConnectTimeout:
            raise self._timeout("connect") from None
        except Http1Timeout:
            raise self._timeout(waiting_for) from None
        except Http1Refused as exc:
            raise refused_error(self.name, exc) from exc
        except Http1Error as exc:
            raise unreachable_error(self.name, exc) from exc

    async def _read_json(
        self, resp: Http1Response, deadline: float | None, waiting_for: str
    ) -> dict[str, Any]:
        """The answer's JSON object, by `deadline` (None: the exchange's, armed by `post`)."""
        try:
            if deadline is None:
                raw = await resp.read()
            else:
                async with asyncio.timeout_at(deadline):
                    raw = await resp.read()
        except (TimeoutError, Http1Timeout):
            raise self._timeout(waiting_for) from None
        except Http1Error as exc:
            raise broken_error(self.name, exc) from exc
        try:
            payload = jsoncodec.loads(raw)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            raise unreadable_error(self.name, "answer", f"not a JSON object: {raw[:200]!r}")
        return payload

    async def _http_error(self, resp: Http1Response | aiohttp.ClientResponse) -> ProviderError:
        try:
            async with asyncio.timeout(self._config.idle_timeout_s):
                raw = await resp.read()
            message = error_message(jsoncodec.loads(raw))
        except (TimeoutError, Http1Error, aiohttp.ClientError, ValueError):
            message = resp.reason or ""
        # Http1Response's header names are lower-case; aiohttp's lookup ignores case.
        return http_error(self.name, resp.status, message, resp.headers.get("retry-after"))

    def _timeout(self, what: str) -> UpstreamTimeout:
        c = self._config
        limits = (c.connect_timeout_s, c.first_byte_timeout_s, c.idle_timeout_s, c.answer_timeout_s)
        return timeout_error(self.name, what, *limits, total_s=c.total_timeout_s)

    async def models(self) -> list[ModelCard]:
        if self._config.models:
            return [ModelCard(model, self.name) for model in self._config.models]
        return await list_models(
            self._open_session(),
            self._models_url,
            self.name,
            self._config.models_timeout_s,
            self._http_error,
            self._timeout,
        )

    async def health(self) -> bool:
        """A cheap GET /models: True when the upstream answers 200 within the health timeout."""
        try:
            session = self._open_session()
        except ProviderError:
            return False
        return await answers_ok(session, self._models_url, self._config.health_timeout_s)
