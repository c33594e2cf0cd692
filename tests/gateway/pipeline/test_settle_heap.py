"""gateway/server/serve.py's `settle_heap`: startup's objects leave the collector's scans, the young
generation's threshold is the setting's, and reference cycles made afterwards are still
collected."""

from __future__ import annotations

import gc
import weakref

from gateway.config.process import ServerSettings
from gateway.server.serve import settle_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_frozen_startup_and_cycles_still_collected() -> None:
    before = gc.get_threshold()
    try:
        settle_heap(ServerSettings().gc_young_threshold)
        assert gc.get_freeze_count() > 1000  # this test process's modules, at the least
        assert gc.get_threshold() == (10_000, *before[1:])
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
