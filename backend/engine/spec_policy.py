"""When speculation pays, from the decode steps the engine has timed on its own device. No torch.

Per batch bucket (1, 2, 4, 8, ... sequences) the policy keeps two rates, each an exponential
moving average of one decode step's tokens per second per sequence: steps that drafted (their
accepted drafts, the bonus token, the wider verifying forward and the MTP layer's time
included) and plain steps. A bucket first drafts for ``min_samples`` steps, then decodes plain
for as many, then drafts only while its drafting rate beats its plain rate by ``margin``; every
``explore_every`` decisions after a new verdict it runs two steps of the losing mode so that a
change (acceptance falling, a heavier batch mix) is seen, and twice as long after each such try
that confirms the verdict (up to ``max_explore_every``). Only steady drafting steps are
measured (those that verified the drafts of the step before). Its cost against the better
mode is bounded by the exploring steps: with the defaults, 2 steps in 64 at first and 2 in
1,024 once settled.
"""

from __future__ import annotations

from dataclasses import dataclass

# Consecutive steps of the losing mode when exploring: a drafting step verifies the drafts of
# the step before it, so the first one only proposes and the second is measured.
EXPLORE_STEPS = 2


@dataclass(slots=True)
class _Rate:
    """An exponential moving average of tokens per second per sequence."""

    value: float = 0.0
    samples: int = 0

    def add(self, rate: float, weight: float) -> None:
        self.value = rate if not self.samples else self.value + weight * (rate - self.value)
        self.samples += 1


@dataclass(slots=True)
class _Bucket:
    drafted: _Rate
    plain: _Rate
    decisions: int = 0
    exploring: int = 0  # steps of the losing mode still to run
    interval: int = 0  # decisions between explorations (0: not yet set)
    next_explore: int = 0
    verdict: bool | None = None  # drafting paid at the last decision


def batch_bucket(batch_size: int) -> int:
    """The power of two at or above ``batch_size`` (its bucket)."""
    if batch_size < 1:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    return 1 << (batch_size - 1).bit_length()


class SpecPolicy:
    """Decides per step whether to draft, from measured decode rates per batch bucket.

    ``min_samples``: steps of each mode measured before comparing; ``margin``: how much faster
    drafting must measure (1.02: 2%) to be chosen, so noise settles on plain decoding;
    ``explore_every``: decisions before the losing mode is tried again after a new verdict,
    doubled after each try that confirms it, up to ``max_explore_every``; ``weight``: the
    moving averages' weight of a new step.
    """

    def __init__(
        self,
        *,
        min_samples: int = 4,
        margin: float = 1.02,
        explore_every: int = 64,
        max_explore_every: int = 1024,
        weight: float = 0.2,
    ) -> None:
        if min_samples < 1 or explore_every < 2 or margin < 1.0 or not 0.0 < weight <= 1.0:
            raise ValueError(
                "need min_samples >= 1, explore_every >= 2, margin >= 1, 0 < weight <= 1"
            )
        self.min_samples = min_samples
        self.margin = margin
        self.explore_every = explore_every
        self.max_explore_every = max(explore_every, max_explore_every)
        self.weight = weight
        self._buckets: dict[int, _Bucket] = {}

    def should_draft(self, batch_size: int) -> bool:
        """Whether a step whose expected batch is ``batch_size`` sequences drafts."""
        bucket = self._bucket(batch_size)
        bucket.decisions += 1
        if bucket.drafted.samples < self.min_samples:
            return True
        if bucket.plain.samples < self.min_samples:
            return False
        better = self._drafting_pays(bucket)
        if better != bucket.verdict:  # a new verdict: look again soon
            bucket.verdict = better
            bucket.interval = self.explore_every
            bucket.next_explore = bucket.decisions + bucket.interval
        elif bucket.decisions >= bucket.next_explore and not bucket.exploring:
            bucket.exploring = EXPLORE_STEPS
            bucket.interval = min(2 * bucket.interval, self.max_explore_every)
            bucket.next_explore = bucket.decisions + bucket.interval
        if bucket.exploring:
            bucket.exploring -= 1
            return not better
        return better

    def observe(self, batch_size: int, drafted: bool, tokens: int, seconds: float) -> None:
        """One decode step (every sequence decoding; none prefilling) of ``batch_size``
        sequences emitted ``tokens`` in ``seconds``, drafting or not."""
        if batch_size < 1 or tokens < 0 or seconds <= 0.0:
            return
        bucket = self._bucket(batch_size)
        rate = tokens / seconds / batch_size
        (bucket.drafted if drafted else bucket.plain).add(rate, self.weight)

    def drafting_pays(self, batch_size: int) -> bool | None:
        """The bucket's measured verdict, None until both modes are measured."""
        bucket = self._buckets.get(batch_bucket(batch_size))
        if bucket is None or min(bucket.drafted.samples, bucket.plain.samples) < self.min_samples:
            return None
        return self._drafting_pays(bucket)

    def rates(self) -> dict[int, tuple[float, float]]:
        """Per bucket: (drafting, plain) tokens per second per sequence (0.0: unmeasured)."""
        return {
            size: (bucket.drafted.value, bucket.plain.value)
            for size, bucket in sorted(self._buckets.items())
        }

    def _drafting_pays(self, bucket: _Bucket) -> bool:
        return bucket.drafted.value > bucket.plain.value * self.margin

    def _bucket(self, batch_size: int) -> _Bucket:
        size = batch_bucket(batch_size)
        bucket = self._buckets.get(size)
        if bucket is None:
            bucket = self._buckets[size] = _Bucket(_Rate(), _Rate())
        return bucket
