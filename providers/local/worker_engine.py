"""Worker 0's engine, seen from another serving process of `[server] workers = N`.

Workers 1..N-1 load no model weights and import no torch. Each keeps a `SharedLocalProvider`:
the ordinary `LocalProvider` (tokenizer, chat template, output parsing, stop strings, usage)
over a `SharedEngine`, which sends the prompt ids to worker 0's internal engine endpoint on a
unix socket (`providers.local.remote_engine.RemoteEngine`, the cluster's client) and streams the
engine's outputs back. Closing a request's stream closes its connection, and worker 0 aborts
the request there (its blocks are freed at the engine's next step).

Load and liveness come from a poll, not from a round trip per request: every `poll_s` the
worker asks `GET /internal/engine` (what the engine is, and its stats). `load()` reads the
latest answer, plus the requests this worker sent since that answer was asked for (counted as
waiting), so a burst between two polls is not invisible. `health()` is true while the last
poll was answered by a running engine. Until the first answer (worker 0 still loading the
model) the provider is loading: prompts get a 503 `engine_loading`, /readyz says so,
and the tokenizer is loaded from the checkpoint directory worker 0 announces (the same files
its engine loaded). Worker 0's prefix cache is not seen from here: prompts are hashed with its
engine's seed and block size, but `cached_prefix_blocks` answers 0, so the router's
local-or-upstream choice in these workers goes by context and queue alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import aiohttp
import structlog

from backend.engine.interface import EngineStats, RequestOutput
from backend.engine.request import FinishReason
from backend.engine.sampling_params import SamplingParams
from backend.text.tokenizer import Tokenizer
from plumbing.record import record
from providers.local.deferred import DeferredLocalProvider, LoadProgress
from providers.local.provider import LocalProvider
from providers.local.remote_engine import SECRET_HEADER, RemoteEngine

log = structlog.get_logger("providers.local.worker_engine")

ENGINE_PATH = "/internal/engine"
_ROOT = "http://localhost"  # the host part of URLs on a unix socket
_STAT_FIELDS = tuple(f.name for f in fields(EngineStats))


@record
class EngineInfo:
    """What worker 0 says of its engine: where its checkpoint is, its limits, its prefix-cache
    hash chain (block size and seed), and its stats."""

    checkpoint: Path
    model_id: str
    max_model_len: int
    slots: int
    running: bool
    stats: EngineStats
    block_size: int
    hash_seed: bytes
    failure: dict[str, Any] | None = None  # why the engine stopped (`engine_failure`)

    def to_json(self) -> bytes:
        data = {
            "checkpoint": str(self.checkpoint),
            "model_id": self.model_id,
            "max_model_len": self.max_model_len,
            "slots": self.slots,
            "running": self.running,
            "stats": asdict(self.stats),
            "block_size": self.block_size,
            "hash_seed": self.hash_seed.hex(),
            "failure": self.failure,
        }
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: Any) -> EngineInfo:
        """Raises KeyError, TypeError or ValueError for an answer of another shape."""
        stats = data["stats"]
        return cls(
            checkpoint=Path(data["checkpoint"]),
            model_id=str(data["model_id"]),
            max_model_len=int(data["max_model_len"]),
            slots=int(data["slots"]),
            running=bool(data["running"]),
            stats=EngineStats(**{name: stats[name] for name in _STAT_FIELDS}),
            block_size=int(data["block_size"]),
            hash_seed=bytes.fromhex(data["hash_seed"]),
            failure=_failure(data.get("failure")),
        )

    @classmethod
    def of(cls, provider: LocalProvider) -> EngineInfo:
        """Worker 0's in-process provider, described for the other workers."""
        if provider.checkpoint is None:
            raise ValueError(f"provider {provider.name!r} does not know its checkpoint")
        engine = provider.engine
        return cls(
            provider.checkpoint.resolve(),
            provider.model_id,
            engine.max_model_len,
            provider.slots,
            engine.is_running,
            engine.stats(),
            engine.block_size,
            engine.hash_seed,
            provider.engine_failure(),
        )


def _failure(data: Any) -> dict[str, Any] | None:
    """A polled `failure`: {"reason": str, "ranks": {rank: cause}} or None."""
    if data is None:
        return None
    ranks = data["ranks"]
    if not isinstance(data["reason"], str) or not isinstance(ranks, dict):
        raise TypeError("failure needs a reason and ranks")
    return {"reason": data["reason"], "ranks": {str(r): str(c) for r, c in ranks.items()}}


class SharedEngine:
    """A `ServedEngine` whose steps run in worker 0: generation over the socket, size and load
    from the latest poll (`update`)."""

    def __init__(self, session: aiohttp.ClientSession, secret: str, info: EngineInfo) -> None:
        self._remote = RemoteEngine(session, _ROOT, secret)
        self._info = info
        self._reachable = True
        self._sent = 0  # requests this worker has sent
        self._sent_before_info = 0  # ... of which the latest info counts

    @property
    def max_model_len(self) -> int:
        return self._info.max_model_len

    @property
    def is_running(self) -> bool:
        return self._reachable and self._info.running

    @property
    def block_size(self) -> int:
        return self._info.block_size

    @property
    def failure(self) -> dict[str, Any] | None:
        """Why worker 0's engine stopped (`LocalProvider.engine_failure`), as last polled."""
        return self._info.failure

    @property
    def hash_seed(self) -> bytes:
        return self._info.hash_seed

    def cached_prefix_blocks(self, hashes: Sequence[bytes]) -> int:
        """Unknown here (worker 0's block manager is in worker 0): none."""
        return 0

    def stats(self) -> EngineStats:
        """The latest snapshot; requests sent since it was asked for count as waiting."""
        stats = self._info.stats
        since = self._sent - self._sent_before_info
        return replace(stats, num_waiting=stats.num_waiting + since) if since else stats

    def queue_counts(self) -> tuple[int, int]:
        stats = self._info.stats
        return stats.num_waiting + self._sent - self._sent_before_info, stats.num_running

    def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncGenerator[RequestOutput, None]:
        self._sent += 1
        return self._remote.generate(request_id, prompt_ids, params)

    def finish(self, request_id: str, reason: FinishReason = "stop") -> None:
        """Nothing to send: the caller closes the stream next, which ends it in worker 0."""

    @property
    def sent(self) -> int:
        return self._sent

    def update(self, info: EngineInfo, sent_before: int) -> None:
        """A poll's answer; it was asked for after `sent_before` requests had been sent."""
        self._info, self._sent_before_info, self._reachable = info, sent_before, True

    def lost(self) -> None:
        self._reachable = False


class SharedLocalProvider(DeferredLocalProvider):
    """The local provider of a worker without the engine: loading (503 `engine_loading`)
    until worker 0's engine has answered once; then a `LocalProvider` over the
    `SharedEngine` serves everything."""

    def __init__(self, name: str) -> None:
        super().__init__(name, LoadProgress("waiting for worker 0's engine"))
        self._engine: SharedEngine | None = None

    def engine_stats(self) -> EngineStats | None:
        return self._engine.stats() if self._engine is not None else None

    def engine_failure(self) -> dict[str, Any] | None:
        """Why worker 0's engine stopped, from its latest poll (None while it runs)."""
        return self._engine.failure if self._engine is not None else None

    @property
    def engine(self) -> SharedEngine | None:
        return self._engine

    def attach(self, engine: SharedEngine, tokenizer: Tokenizer, info: EngineInfo) -> None:
        self._engine = engine
        self.set_local(
            LocalProvider(
                self.name,
                engine,
                tokenizer,
                info.model_id,
                slots=info.slots,
                checkpoint=info.checkpoint,
            )
        )


@asynccontextmanager
async def connect_worker_engine(
    name: str, socket_path: Path, secret: str, *, poll_s: float, timeout_s: float = 2.0
) -> AsyncIterator[SharedLocalProvider]:
    """The provider of a worker without the engine, reaching worker 0 at `socket_path`; it
    polls the engine every `poll_s` (each ask gives up after `timeout_s`) until exit."""
    connector = aiohttp.UnixConnector(path=str(socket_path), limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s)
    provider = SharedLocalProvider(name)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        poller = _Poller(provider, session, secret, socket_path, timeout_s)
        task = asyncio.create_task(poller.run(poll_s), name=f"shared-engine-poll-{name}")
        try:
            yield provider
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _Poller:
    def __init__(
        self,
        provider: SharedLocalProvider,
        session: aiohttp.ClientSession,
        secret: str,
        socket_path: Path,
        timeout_s: float,
    ) -> None:
        self._provider = provider
        self._session = session
        self._secret = secret
        self._socket = socket_path
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._reachable: bool | None = None  # None: not asked yet
        self._tokenizer_failed = False

    async def run(self, poll_s: float) -> None:
        while True:
            await self.once()
            await asyncio.sleep(poll_s)

    async def once(self) -> None:
        engine = self._provider.engine
        sent_before = engine.sent if engine is not None else 0
        try:
            info = await self._ask()
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            if engine is not None:
                engine.lost()
            self._note(False, exc)
            return
        if engine is None:
            await self._attach(info)
        else:
            engine.update(info, sent_before)
        self._note(True, None)

    async def _ask(self) -> EngineInfo:
        async with self._session.get(
            _ROOT + ENGINE_PATH, headers={SECRET_HEADER: self._secret}, timeout=self._timeout
        ) as resp:
            if resp.status != 200:
                raise ValueError(f"worker 0 answered {resp.status}")
            return EngineInfo.from_json(await resp.json(content_type=None))

    async def _attach(self, info: EngineInfo) -> None:
        try:
            tokenizer = await asyncio.to_thread(Tokenizer.from_dir, info.checkpoint)
        except (OSError, ValueError) as exc:
            if not self._tokenizer_failed:
                log.error("shared_engine_tokenizer_failed", path=str(info.checkpoint), error=exc)
            self._tokenizer_failed = True
            return
        engine = SharedEngine(self._session, self._secret, info)
        self._provider.attach(engine, tokenizer, info)
        log.info(
            "shared_engine_attached",
            provider=self._provider.name,
            socket=str(self._socket),
            checkpoint=str(info.checkpoint),
            max_model_len=info.max_model_len,
        )

    def _note(self, reachable: bool, error: BaseException | None) -> None:
        """Log the changes of reachability only (not every poll)."""
        if reachable == self._reachable:
            return
        if reachable:
            log.info("shared_engine_reachable", provider=self._provider.name)
        elif self._reachable is not None:
            log.warning(
                "shared_engine_unreachable",
                provider=self._provider.name,
                error=f"{type(error).__name__}: {error}",
            )
        self._reachable = reachable
