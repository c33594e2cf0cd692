"""The speculation policy's decisions from measured decode rates, on plain data (no torch, no
clocks): a batch size drafts only while drafting measures faster there."""

from __future__ import annotations

import pytest

from backend.engine.scheduler import Scheduler
from backend.engine.spec_policy import EXPLORE_STEPS, SpecPolicy, batch_bucket


def _feed(policy: SpecPolicy, batch: int, steps: int, drafted_ms: float, plain_ms: float,
          accepted: float) -> list[bool]:  # fmt: skip
    """Run ``steps`` decisions at ``batch``; a drafting step takes ``drafted_ms`` and emits
    1 + ``accepted`` tokens a sequence, a plain one ``plain_ms`` and 1. Returns the decisions."""
    decisions = []
    for _ in range(steps):
        drafted = policy.should_draft(batch)
        decisions.append(drafted)
        if drafted:
            tokens = round(batch * (1 + accepted))
            policy.observe(batch, True, tokens, drafted_ms / 1000)
        else:
            policy.observe(batch, False, batch, plain_ms / 1000)
    return decisions


def test_buckets_are_powers_of_two() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [
        1, 2, 4, 4, 8, 8, 16, 32, 64,
    ]  # fmt: skip
    with pytest.raises(ValueError):
        batch_bucket(0)


def test_measures_both_modes_then_drafts_where_it_pays() -> None:
    policy = SpecPolicy(min_samples=3, explore_every=50)
    # batch 1: a drafting step costs 1.3 plain steps and emits 1.7 tokens: 1.31x
    decisions = _feed(policy, 1, 40, drafted_ms=13, plain_ms=10, accepted=0.7)
    assert decisions[:6] == [True] * 3 + [False] * 3
    assert all(decisions[6:])
    assert policy.drafting_pays(1) is True
    # batch 32: a drafting step costs 1.8 plain steps for 1.5 tokens: 0.83x
    decisions = _feed(policy, 32, 40, drafted_ms=90, plain_ms=50, accepted=0.5)
    assert decisions[:6] == [True] * 3 + [False] * 3
    assert not any(decisions[6:])
    assert policy.drafting_pays(32) is False and policy.drafting_pays(17) is False
    assert policy.drafting_pays(8) is None  # never measured
    drafted, plain = policy.rates()[32]
    assert drafted == pytest.approx(1.5 / 0.09) and plain == pytest.approx(1 / 0.05)


def test_a_tie_within_the_margin_stays_plain() -> None:
    policy = SpecPolicy(min_samples=2, margin=1.05)
    decisions = _feed(policy, 4, 30, drafted_ms=10, plain_ms=10, accepted=0.03)
    assert not any(decisions[4:])


def test_the_losing_mode_is_retried_and_a_change_is_followed() -> None:
    policy = SpecPolicy(min_samples=2, explore_every=10, weight=0.5)
    first = _feed(policy, 8, 40, drafted_ms=20, plain_ms=10, accepted=0.5)  # drafting loses
    explored = [i for i, d in enumerate(first) if d and i >= 4]
    assert explored and len(explored) <= EXPLORE_STEPS * (40 // 10)  # a bounded share
    # drafting becomes cheap (say, a bigger model): the explored steps see it and it wins
    later = _feed(policy, 8, 120, drafted_ms=11, plain_ms=10, accepted=0.9)
    assert sum(later[-20:]) >= 20 - 2 * EXPLORE_STEPS  # drafting now, but for exploring
    assert policy.drafting_pays(8) is True


def test_never_slower_than_plain_decoding_at_any_batch() -> None:
    """Over a long run the policy's tokens per second reach at least the better mode's, less
    its measuring and exploring steps (here within 5%)."""
    for batch, drafted_ms, plain_ms, accepted in [
        (1, 12, 10, 0.7), (8, 15, 10, 0.55), (32, 19, 10, 0.5), (64, 25, 10, 0.5),
    ]:  # fmt: skip
        policy = SpecPolicy()
        decisions = _feed(policy, batch, 2000, drafted_ms, plain_ms, accepted)
        seconds = sum(drafted_ms if d else plain_ms for d in decisions)
        tokens = sum(1 + accepted if d else 1 for d in decisions)
        best = max(1 / plain_ms, (1 + accepted) / drafted_ms)
        assert tokens / seconds >= 0.95 * best, batch


def test_ignores_steps_it_cannot_use() -> None:
    policy = SpecPolicy(min_samples=1)
    policy.observe(4, True, 6, 0.0)
    policy.observe(0, False, 0, 0.01)
    assert policy.rates() == {}


def test_the_scheduler_asks_the_policy_under_the_cap() -> None:
    asked: list[int] = []

    def policy(expected: int) -> bool:
        asked.append(expected)
        return expected < 3

    from backend.engine.blocks import BlockManager
    from backend.engine.request import Request
    from backend.engine.sampling_params import SamplingParams

    manager = BlockManager(64, 4, b"seed")
    scheduler = Scheduler(
        8, 64, manager, True, max_model_len=64, eos_token_ids=(), num_lookahead=1,
        spec_max_batch_size=4, draft_policy=policy,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=4)
    for i in range(2):
        scheduler.add(Request(f"r{i}", [1, 2, 3], params))
    assert scheduler.schedule().num_spec_tokens == 1 and asked == [2]
    for i in range(2, 5):
        scheduler.add(Request(f"r{i}", [1, 2, 3], params))
    assert scheduler.schedule().num_spec_tokens == 0 and asked == [2]  # over the cap: not asked


def test_a_settled_verdict_is_tried_less_and_less() -> None:
    policy = SpecPolicy(min_samples=2, explore_every=8, max_explore_every=64)
    decisions = _feed(policy, 2, 600, drafted_ms=30, plain_ms=10, accepted=0.5)
    tries = [i for i, d in enumerate(decisions) if d and i >= 4]
    starts = [i for i in tries if i - 1 not in tries]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps[:3] == [16, 32, 64] and set(gaps[3:]) == {64}  # doubling, then capped
