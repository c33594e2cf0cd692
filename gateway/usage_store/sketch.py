"""A fixed log-bucket latency histogram: mergeable by adding counts (in SQL, column by column).

Bucket 0 holds [0, 1) ms; bucket i in 1..BUCKETS-2 holds [2^((i-1)/2), 2^(i/2)) ms; the last
holds everything from 2^((BUCKETS-2)/2) ms (about 9 minutes) up. A quantile is read as the
geometric middle of the bucket holding its rank, so its relative error is at most
2^(1/4) - 1 (under 19%) inside the covered range, 0.5 ms in bucket 0, and the last bucket
reads as its lower bound.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate

BUCKETS = 40
ERROR_BOUND = 2**0.25 - 1


def bucket_of(ms: float) -> int:
    if not ms >= 1.0:  # also NaN
        return 0
    return min(int(2 * math.log2(ms)) + 1, BUCKETS - 1)


def value_of(bucket: int) -> float:
    if bucket == 0:
        return 0.5
    if bucket == BUCKETS - 1:
        return 2 ** ((BUCKETS - 2) / 2)
    return 2 ** ((2 * bucket - 1) / 4)


def quantile(counts: Sequence[int], q: float) -> float | None:
    """The q-quantile (0 < q <= 1) of the histogram `counts`; None when it is empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return round(value_of(bucket), 1)
    return round(value_of(len(counts) - 1), 1)


def quantiles(counts: Sequence[int | None], low: float, high: float) -> tuple[float | None, ...]:
    """`quantile(counts, low)` and `quantile(counts, high)`, read off one running sum (a
    summary reads two per row, for many rows); counts may be None (a SQL sum over no rows)."""
    running = list(accumulate([n or 0 for n in counts]))
    total = running[-1] if running else 0
    if total <= 0:
        return None, None
    last = len(running) - 1
    return tuple(
        _READ[min(bisect_left(running, max(1, math.ceil(q * total))), last)] for q in (low, high)
    )


_READ = [round(value_of(bucket), 1) for bucket in range(BUCKETS)]  # each bucket as read
