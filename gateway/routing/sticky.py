"""Conversation stickiness for auto models: a turn that continues the work keeps its mode.

A conversation is named by a hash of the key, the public model and its first messages (system
and developer messages up to the first user message, and that user message), so every turn of
it and every replica finds the same Redis key: `{prefix}route:conv:{sha256}` = "on" | "off",
with a TTL. Only turns that continue the work read it (a tool result, "continue": `ask.turn_of`;
`recall`: a task, started before the prompt is prepared so its round trip overlaps that work).
Every turn decided anew (a new question, a follow-up with an ask of its own) writes its mode,
replacing the one before, in the background (`remember`): the writes of one event-loop iteration
go out together, in one pipelined round trip, once the deciding code has yielded, so no request
waits for them. That is safe because the next turn reads it only after this turn's answer
reached the client, by which time the write, sent while this turn was admitted, has landed;
were it still in flight (Redis stalled), the continuing turn finds the mode before it or none,
and then is decided on the ask it continues.
Stickiness is best-effort: when Redis fails, the request is decided as a new conversation
(logged), never refused.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Coroutine
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from providers.types import ChatRequest

log = structlog.get_logger("gateway.routing")
_HEAD_CHARS = 4096  # of each first message: enough to tell conversations apart


def conversation_id(key_id: str, model: str, request: ChatRequest) -> str | None:
    """The conversation's hash, or None for a request that is no conversation (a completion)."""
    if request.prompt is not None or not request.messages:
        return None
    h = hashlib.sha256(f"{key_id}\n{model}\n".encode())
    for message in request.messages:
        h.update(f"\x00{message.role}\x00{message.text[:_HEAD_CHARS]}".encode())
        if message.role == "user":
            return h.hexdigest()
    return None


class Stickiness:
    def __init__(self, redis: Redis, prefix: str, ttl_s: int) -> None:
        self._redis = redis
        self._prefix = f"{prefix}route:conv:"
        self._ttl_s = ttl_s
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending: dict[str, str] = {}  # Redis key -> mode, not yet sent

    def recall(self, conversation: str) -> asyncio.Task[bool | None]:
        """Start reading the conversation's mode (the caller awaits the task when it needs it,
        or drops it: the task is kept until done)."""
        return self._track(self.mode(conversation))

    def remember(self, conversation: str, thinking: bool) -> None:
        """Store the conversation's mode, replacing the one before (the latest turn decided
        anew wins), in the background (sent once the loop runs again)."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending[self._prefix + conversation] = "on" if thinking else "off"

    async def drain(self) -> None:
        """Send the writes not yet sent and wait for the reads and writes in flight (shutdown,
        before Redis closes; tests)."""
        self._flush()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def mode(self, conversation: str) -> bool | None:
        try:
            raw = await self._redis.get(self._prefix + conversation)
        except (RedisError, OSError) as exc:
            log.warning("sticky_read_failed", error=str(exc))
            return None
        if raw is None:
            return None
        return raw in (b"on", "on")

    def _flush(self) -> None:
        if self._pending:
            writes, self._pending = self._pending, {}
            self._track(self._store(writes))

    async def _store(self, writes: dict[str, str]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key, value in writes.items():
                    pipe.set(key, value, ex=self._ttl_s)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("sticky_write_failed", error=str(exc), writes=len(writes))

    def _track(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
