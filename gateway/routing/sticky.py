"""Conversation stickiness for auto models: a conversation keeps the mode it started with.

A conversation is named by a hash of the key, the public model and its first messages (system
and developer messages up to the first user message, and that user message), so every turn of
it and every replica finds the same Redis key: `{prefix}route:conv:{sha256}` = "on" | "off",
with a TTL. Stickiness is best-effort: when Redis fails, the request is decided as a new
conversation (logged), never refused.
"""

from __future__ import annotations

import hashlib

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


def is_follow_up(request: ChatRequest) -> bool:
    """Whether the conversation has turns before this one (only then is Redis asked)."""
    return any(m.role in ("assistant", "tool") for m in request.messages)


class Stickiness:
    def __init__(self, redis: Redis, prefix: str, ttl_s: int) -> None:
        self._redis = redis
        self._prefix = f"{prefix}route:conv:"
        self._ttl_s = ttl_s

    async def mode(self, conversation: str) -> bool | None:
        try:
            raw = await self._redis.get(self._prefix + conversation)
        except (RedisError, OSError) as exc:
            log.warning("sticky_read_failed", error=str(exc))
            return None
        if raw is None:
            return None
        return raw in (b"on", "on")

    async def remember(self, conversation: str, thinking: bool) -> None:
        """Store the conversation's mode unless it already has one (first writer wins)."""
        value = "on" if thinking else "off"
        try:
            await self._redis.set(self._prefix + conversation, value, ex=self._ttl_s, nx=True)
        except (RedisError, OSError) as exc:
            log.warning("sticky_write_failed", error=str(exc))
