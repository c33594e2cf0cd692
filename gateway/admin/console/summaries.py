"""The console's rollup summaries, shared for a few seconds.

Pages are views of "the last N hours or days up to now" whose queries stay the same within the
hour, and several operators (or one reloading) ask the same ones: each distinct
`UsageStore.summary` answer is kept for `ttl_s`, or for `SPEND` times as long as the store took
to compute it when that is longer (so repeating a costly view spends at most about a tenth of
the store's time on it); a plot may lag the store by that much. Bounded: the least recently
used answers are dropped past `size`. Per process; nothing else is cached (Requests reads
records each time)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from gateway.usage_store.queries import SummaryQuery
from gateway.usage_store.store import UsageStore
from gateway.usage_store.summary_sql import Only

TTL_S = 5.0
SIZE = 128
SPEND = 10  # an answer lives at least this many times its computing time


class Summaries:
    def __init__(self, ttl_s: float = TTL_S, size: int = SIZE) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self._answers: OrderedDict[str, tuple[float, list[dict[str, Any]]]] = OrderedDict()

    async def summary(
        self, store: UsageStore, q: SummaryQuery, only: Only | None = None
    ) -> list[dict[str, Any]]:
        """`store.summary(q, only)`, or its answer of less than `ttl_s` ago. Callers must not
        change the rows they get (they are shared)."""
        key = q.model_dump_json()
        if only:
            key += repr(sorted((d, sorted(map(repr, v))) for d, v in only.items()))
        now = time.monotonic()
        found = self._answers.get(key)
        if found is not None and found[0] > now:
            self._answers.move_to_end(key)
            return found[1]
        rows = await store.summary(q, only)
        done = time.monotonic()
        self._answers[key] = (done + max(self.ttl_s, SPEND * (done - now)), rows)
        self._answers.move_to_end(key)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)
        return rows
