"""The asyncio face of the engine: the step loop runs in its own thread.

One `threading.Thread` owns the `LLMEngine`. Callers on any event loop submit commands (add,
abort, finish; `engine_inbox`) into an inbox guarded by a condition; the thread applies them
between steps, runs one step while work remains, sleeps on the condition when idle, and hands
each output to its request's output stream (an `asyncio.Queue`) with
`loop.call_soon_threadsafe`. A request whose consumer stops iterating is aborted; its blocks are
freed at the next step.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace
from pathlib import Path

from backend.engine.blocks import BlockEvent
from backend.engine.engine_config import EngineConfig
from backend.engine.engine_inbox import Add, Finish, OutputStream
from backend.engine.grammar import GrammarCompiler
from backend.engine.interface import (
    EngineClosed,
    EngineDown,
    EngineError,
    EngineOverloaded,
    EngineStats,
    PromptTooLong,
    RequestOutput,
)
from backend.engine.llm_engine import LLMEngine
from backend.engine.loading import load_engine
from backend.engine.request import FinishReason
from backend.engine.sampling_params import SamplingParams
from backend.text.tokenizer import TOKENIZER_FILE, Tokenizer

__all__ = [
    "AsyncEngine",
    "EngineClosed",
    "EngineError",
    "EngineOverloaded",
    "EngineStats",
    "LLMEngine",
    "PromptTooLong",
    "RequestOutput",
]

logger = logging.getLogger(__name__)

_MAX_RETRY_AFTER_S = 60.0


class _State(enum.Enum):
    NEW = enum.auto()
    RUNNING = enum.auto()
    STOPPING = enum.auto()
    STOPPED = enum.auto()


class AsyncEngine:
    """Serves an `LLMEngine` to asyncio code; `start()` it, then `generate` from any loop.

    Thread-safe: `generate`, `abort`, `finish` and `stats` may be called from any thread or
    event loop. `max_waiting` (from the engine's config) bounds requests not yet running.
    """

    def __init__(self, engine: LLMEngine, grammars: GrammarCompiler | None = None) -> None:
        self._engine = engine
        self._grammars = grammars  # None: constrained requests are refused
        self._max_waiting = engine.config.max_waiting
        self._cond = threading.Condition()
        # guarded by _cond:
        self._commands: list[Add | Finish] = []
        self._streams: dict[str, OutputStream] = {}  # requests in flight, by id
        self._num_queued = 0  # adds in _commands not yet applied
        self._state = _State.NEW
        self._stop_deadline = 0.0
        self._stats = engine.stats()
        self._failure: Exception | None = None  # why the thread ended, when it failed
        # owned by the engine thread: the stream of each request the LLMEngine holds
        self._routes: dict[str, OutputStream] = {}
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)

    @classmethod
    def from_checkpoint(
        cls,
        model_dir: str | Path,
        config: EngineConfig,
        *,
        on_block_event: Callable[[BlockEvent], None] | None = None,
        on_load_progress: Callable[[int, int], None] | None = None,
    ) -> AsyncEngine:
        """Load the model and generation_config.json; the checkpoint's fingerprint seeds the
        prefix-cache block hashes. Blocking (seconds to minutes): call it off the event loop.
        `on_load_progress(done, total)`: the weights' tensors loaded so far. Structured output
        compiles over the checkpoint's tokenizer (none: refused)."""
        engine = load_engine(
            model_dir, config, on_block_event=on_block_event, on_load_progress=on_load_progress
        )
        grammars = None  # a checkpoint without a tokenizer serves ids only, unconstrained
        if (Path(model_dir) / TOKENIZER_FILE).is_file():
            grammars = GrammarCompiler(Tokenizer.from_dir(Path(model_dir)), engine.vocab_size)
        return cls(engine, grammars)

    @property
    def max_model_len(self) -> int:
        """Most tokens of prompt and output one request may have."""
        return self._engine.max_model_len

    @property
    def block_size(self) -> int:
        return self._engine.config.block_size

    @property
    def hash_seed(self) -> bytes:
        """Seed of the prefix-cache block hashes (``backend.engine.block_hash.chain_hashes``)."""
        return self._engine.hash_seed

    def cached_prefix_blocks(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of the chain `hashes` the prefix cache holds now
        (thread-safe: see ``BlockManager.cached_prefix_blocks``); for routing, which asks
        before a prompt is queued."""
        return self._engine.block_manager.cached_prefix_blocks(hashes)

    @property
    def is_running(self) -> bool:
        """Started, not stopping, and its thread alive (for health checks)."""
        with self._cond:
            return self._state is _State.RUNNING and self._thread.is_alive()

    @property
    def failure(self) -> Exception | None:
        """The error that ended the engine's thread (an ``EngineDown`` naming the parallel
        engine's ranks at fault, say); None while it runs or after a clean stop."""
        with self._cond:
            return self._failure

    def start(self) -> None:
        with self._cond:
            if self._state is not _State.NEW:
                raise EngineClosed("an AsyncEngine starts once")
            self._state = _State.RUNNING
        self._thread.start()

    async def stop(self, grace_s: float = 0.0) -> None:
        """Refuse new requests, let in-flight ones run up to `grace_s` seconds, abort the rest
        (their consumers receive a final "abort" output) and join the thread."""
        with self._cond:
            if self._state is _State.NEW:
                self._state = _State.STOPPED
                return
            if self._state is _State.RUNNING:
                self._state = _State.STOPPING
                self._stop_deadline = time.monotonic() + grace_s
                self._cond.notify()
        await asyncio.to_thread(self._thread.join)

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step; `num_waiting` also counts requests
        submitted since."""
        with self._cond:
            return replace(self._stats, num_waiting=self._stats.num_waiting + self._num_queued)

    def queue_counts(self) -> tuple[int, int]:
        """(num_waiting, num_running) of `stats()`, without copying the snapshot (per request,
        for routing)."""
        with self._cond:
            stats = self._stats
            return stats.num_waiting + self._num_queued, stats.num_running

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's outputs as steps produce them; the last has `finished` set.

        Before anything is queued (on the first iteration) it raises PromptTooLong or
        ValueError for a bad prompt or a duplicate live request id, EngineOverloaded when
        `max_waiting` requests wait, EngineClosed unless the engine is running. Raises
        EngineError if the engine fails while serving it. Closing the iterator early (aclose,
        cancellation, break) aborts the request.
        """
        self._engine.check_prompt(prompt_ids)
        grammar = None
        if params.grammar is not None:
            grammar = await self._compile(params)
        stream = OutputStream(asyncio.get_running_loop(), asyncio.Queue())
        with self._cond:
            if self._state is not _State.RUNNING:
                raise EngineClosed(f"the engine is {self._state.name.lower()}")
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in flight")
            num_waiting = self._num_queued + self._stats.num_waiting
            if num_waiting >= self._max_waiting:
                raise EngineOverloaded(self._retry_after_s(num_waiting))
            self._streams[request_id] = stream
            self._num_queued += 1
            self._commands.append(Add(request_id, list(prompt_ids), params, stream, grammar))
            self._cond.notify()
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    async def _compile(self, params: SamplingParams) -> object:
        """`params.grammar` compiled: from the cache, else in a worker thread (GrammarError,
        a ValueError, where it does not compile)."""
        assert params.grammar is not None
        if self._grammars is None:
            raise ValueError("this engine has no grammar compiler: structured output is off")
        compiled = self._grammars.cached(params.grammar)
        if compiled is None:
            compiled = await asyncio.to_thread(self._grammars.compile, params.grammar)
        return compiled

    def abort(self, request_id: str) -> None:
        """Abort a request in flight; no further outputs reach its consumer."""
        with self._cond:
            stream = self._streams.pop(request_id, None)
            if stream is None:
                return
            stream.closed = True
            self._commands.append(Finish(request_id, "abort"))
            self._cond.notify()

    def finish(self, request_id: str, reason: FinishReason = "stop") -> None:
        """End a request at the next step (its consumer matched a stop string, say); the
        consumer then receives a final output with `reason`."""
        with self._cond:
            if request_id in self._streams:
                self._commands.append(Finish(request_id, reason))
                self._cond.notify()

    def _retry_after_s(self, num_waiting: int) -> float:
        """A hint: roughly one step per request ahead, at least a second."""
        estimate = num_waiting * self._stats.last_step_seconds
        return min(_MAX_RETRY_AFTER_S, max(1.0, round(estimate, 1)))

    # The engine thread.

    def _run(self) -> None:
        try:
            while self._loop_once():
                pass
        except Exception as exc:
            logger.exception("the engine thread died")
            with self._cond:
                self._failure = exc
                # down before any stream hears of it: a client told of the failure that asks
                # /readyz next must not find the engine running
                self._state = _State.STOPPED
            self._fail_streams(lambda: EngineError("the engine stopped unexpectedly"), exc)
        finally:
            with self._cond:
                self._state = _State.STOPPED
            self._fail_streams(lambda: EngineClosed("the engine has stopped"), None)
            try:
                self._engine.close()
            except Exception:
                logger.exception("releasing the engine's model failed")

    def _loop_once(self) -> bool:
        """Apply queued commands, then run one step if work remains; False to stop."""
        engine = self._engine
        with self._cond:
            while (
                not self._commands and not engine.has_unfinished and self._state is _State.RUNNING
            ):
                self._cond.wait()
            commands, self._commands = self._commands, []
            stopping = self._state is _State.STOPPING
            deadline = self._stop_deadline
        deliveries = self._apply(commands)
        if stopping and (not engine.has_unfinished or time.monotonic() >= deadline):
            deliveries += self._route(engine.abort_all())
            self._publish(commands)
            self._deliver(deliveries)
            return False
        if engine.has_unfinished:
            try:
                deliveries += self._route(engine.step())
            except EngineDown:
                raise  # no step can run any more: the thread ends and fails every request
            except Exception as exc:
                logger.exception("engine step failed; failing its requests")
                failed = engine.abort_all()
                self._fail_streams(
                    lambda: EngineError("the engine failed this request"), exc, failed
                )
        self._publish(commands)  # first, so a consumer never sees stats older than its output
        self._deliver(deliveries)
        return True

    def _apply(self, commands: list[Add | Finish]) -> list[tuple[OutputStream, RequestOutput]]:
        """Apply commands in order; the final outputs of finished requests, routed at once
        (a later add may reuse the request id)."""
        deliveries: list[tuple[OutputStream, RequestOutput]] = []
        for command in commands:
            if isinstance(command, Finish):
                output = self._engine.finish(command.request_id, command.reason)
                if output is not None:
                    deliveries += self._route([output])
                continue
            try:
                self._engine.add_request(
                    command.request_id, command.prompt_ids, command.params, command.grammar
                )
            except ValueError as exc:
                self._reject(command.request_id, command.stream, exc)
            else:
                self._routes[command.request_id] = command.stream
        return deliveries

    def _route(self, outputs: list[RequestOutput]) -> list[tuple[OutputStream, RequestOutput]]:
        """Pair outputs with their streams; a finished request's route ends here."""
        deliveries: list[tuple[OutputStream, RequestOutput]] = []
        for output in outputs:
            if output.finished:
                stream = self._routes.pop(output.request_id, None)
            else:
                stream = self._routes.get(output.request_id)
            if stream is not None:
                deliveries.append((stream, output))
        return deliveries

    def _deliver(self, deliveries: list[tuple[OutputStream, RequestOutput]]) -> None:
        """Hand outputs to streams still open; a finished output closes its stream."""
        with self._cond:
            open_deliveries = [(s, o) for s, o in deliveries if not s.closed]
            for stream, output in open_deliveries:
                if output.finished:
                    self._close(output.request_id, stream)
        for stream, output in open_deliveries:
            stream.put(output)

    def _publish(self, commands: list[Add | Finish]) -> None:
        stats = self._engine.stats()
        with self._cond:
            self._num_queued -= sum(isinstance(c, Add) for c in commands)
            self._stats = stats

    def _fail_streams(
        self,
        make_error: Callable[[], Exception],
        cause: BaseException | None,
        outputs: list[RequestOutput] | None = None,
    ) -> None:
        """Raise a fresh error in the consumers of `outputs`' requests (all if None)."""
        if outputs is None:
            with self._cond:
                pairs = [*self._routes.items(), *self._streams.items()]
            self._routes.clear()
        else:
            pairs = [
                (o.request_id, s) for o in outputs if (s := self._routes.pop(o.request_id, None))
            ]
        self._close_and_put(pairs, make_error, cause)

    def _close_and_put(
        self,
        pairs: list[tuple[str, OutputStream]],
        make_error: Callable[[], Exception],
        cause: BaseException | None,
    ) -> None:
        """Close each still open stream and hand it a fresh error caused by `cause`."""
        opened: list[OutputStream] = []
        with self._cond:
            for request_id, stream in pairs:
                if not stream.closed:
                    self._close(request_id, stream)
                    opened.append(stream)
        for stream in opened:
            error = make_error()
            if cause is not None:
                error.__cause__ = cause
            stream.put(error)

    def _reject(self, request_id: str, stream: OutputStream, error: Exception) -> None:
        """The engine refused the request: hand its stream `error` unless it is closed."""
        with self._cond:
            if stream.closed:
                return
            self._close(request_id, stream)
        stream.put(error)

    def _close(self, request_id: str, stream: OutputStream) -> None:
        """Under the lock: no more items for `stream`; frees its request id for reuse."""
        stream.closed = True
        if self._streams.get(request_id) is stream:
            del self._streams[request_id]
