"""Upstream affinity: a conversation keeps to one of several upstream accounts (API keys).

An upstream with its own prefix cache (DeepSeek's API bills cache hits at a fraction of a miss)
serves a conversation's later turns from cache only when they reach the same account. A
conversation is named by a hash of its first messages (system and developer messages and the
first user message, which every later turn repeats) and given the account of highest
rendezvous weight, so adding or removing an account moves only the conversations it wins or
held.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from providers.types import ChatRequest

_PERSON = b"gw-affinity"


def conversation_key(request: ChatRequest) -> bytes:
    """A digest of the request's opening: stable over the turns of one conversation."""
    h = hashlib.blake2b(digest_size=16, person=_PERSON)
    if request.prompt is not None:
        h.update(request.prompt[:1024].encode())
        return h.digest()
    for message in request.messages:
        h.update(json.dumps(message.openai_dict(), sort_keys=True).encode())
        if message.role == "user":
            break
    return h.digest()


def pick(accounts: Sequence[str], key: bytes) -> int:
    """Index of the account (named by a stable identity) that `key` belongs to."""
    return rank(accounts, key)[0]


def rank(accounts: Sequence[str], key: bytes) -> list[int]:
    """Indexes of `accounts` by `key`'s preference, its own account first: where that one
    cannot serve, the conversation moves to the next (the same one every time)."""
    if not accounts:
        raise ValueError("no accounts to pick from")
    weights = [
        hashlib.blake2b(key + name.encode(), digest_size=8, person=_PERSON).digest()
        for name in accounts
    ]
    return sorted(range(len(accounts)), key=weights.__getitem__, reverse=True)
