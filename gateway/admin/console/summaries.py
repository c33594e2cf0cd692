"""The console's rollup summaries, shared for a few seconds.

Pages are views of "the last N hours or days up to now" whose queries stay the same within the
hour, and several operators (or one reloading) ask the same ones: each distinct
`UsageStore.summary` query is answered from the store at most once per `ttl_s`, so a plot may
lag the store by that much. Bounded: the least recently used answers are dropped past `size`.
Per process; nothing else is cached (Requests reads records each time)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from gateway.usage_store.queries import SummaryQuery
from gateway.usage_store.store import UsageStore

TTL_S = 5.0
SIZE = 128


class Summaries:
    def __init__(self, ttl_s: float = TTL_S, size: int = SIZE) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self._answers: OrderedDict[str, tuple[float, list[dict[str, Any]]]] = OrderedDict()

    async def summary(self, store: UsageStore, q: SummaryQuery) -> list[dict[str, Any]]:
        """`store.summary(q)`, or its answer of less than `ttl_s` ago. Callers must not change
        the rows they get (they are shared)."""
        key = q.model_dump_json()
        now = time.monotonic()
        found = self._answers.get(key)
        if found is not None and found[0] > now:
            self._answers.move_to_end(key)
            return found[1]
        rows = await store.summary(q)
        self._answers[key] = (now + self.ttl_s, rows)
        self._answers.move_to_end(key)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)
        return rows
