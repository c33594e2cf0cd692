"""RedisAccessControl against a real Redis with an injected clock: authentication, budgets,
RPM/TPM windows, concurrency slots, settlement and usage records."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.access.contract import Grant, Outcome, Principal, Ticket, require_model
from gateway.errors import AuthenticationError, PermissionDenied, QuotaExceeded, RateLimited
from gateway.keys.records import KeyCreate, KeyRecord, KeyUpdate, UsageQuery
from gateway.keys.redis_access import RedisAccessControl
from gateway.keys.usage import UsageReader
from providers.types import Usage
from tests.support.clock import START, Clock
from tests.support.limiter import limiter_access


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def access(redis: Redis, clock: Clock, tmp_path: Path) -> AsyncIterator[RedisAccessControl]:
    async with limiter_access(redis, clock, tmp_path) as access:
        yield access


async def make_key(access: RedisAccessControl, **limits: object) -> tuple[str, Principal]:
    secret, _ = await access.store.create(KeyCreate.model_validate({"name": "t", **limits}))
    return secret, await access.authenticate(secret)


def ticket(principal: Principal, prompt: int, max_tokens: int, model: str = "m") -> Ticket:
    return Ticket(principal, model, f"req_{uuid.uuid4().hex}", prompt, max_tokens)


async def settle(access: RedisAccessControl, grant: Grant, prompt: int, completion: int) -> None:
    await access.settle(grant, Outcome(Usage(prompt, completion), 200, provider="mock"))


async def spent(access: RedisAccessControl, redis: Redis, key_id: str, stamp: str) -> int:
    return int(await redis.get(access.store.space.spent(key_id, stamp)) or 0)


async def test_authenticate_refuses_missing_unknown_disabled_expired_and_revoked(
    access: RedisAccessControl, clock: Clock, redis: Redis
) -> None:
    uncached = RedisAccessControl(
        redis,
        prefix=access.store.space.prefix,
        usage_stream_maxlen=3,
        auth_cache_s=0,
        clock=clock,
    )
    expires = datetime.fromtimestamp(START, UTC) + timedelta(hours=1)
    secret, principal = await make_key(access, models=["a"], expires_at=expires)
    assert principal.models == frozenset({"a"}) and principal.name == "t"
    for token in (None, "", "not-a-key", "sk-" + "x" * 43):
        with pytest.raises(AuthenticationError):
            await access.authenticate(token)
    await access.store.update(principal.key_id, KeyUpdate(disabled=True))
    with pytest.raises(AuthenticationError, match="disabled"):
        await uncached.authenticate(secret)
    await access.store.update(principal.key_id, KeyUpdate(disabled=False))
    assert await uncached.authenticate(secret) == principal
    clock.now += 3600
    with pytest.raises(AuthenticationError, match="expired"):
        await uncached.authenticate(secret)
    clock.now -= 1
    await access.store.revoke(principal.key_id)
    with pytest.raises(AuthenticationError):
        await uncached.authenticate(secret)
    with pytest.raises(AuthenticationError, match="revoked"):
        await access.admit(ticket(principal, 1, 1))


async def test_admission_rechecks_what_the_auth_cache_may_not_know(
    access: RedisAccessControl, clock: Clock
) -> None:
    """authenticate may answer from its cache for a few seconds; admission never does."""
    expires = datetime.fromtimestamp(START, UTC) + timedelta(hours=1)
    secret, principal = await make_key(access, models=["a", "b"], expires_at=expires)
    assert await access.authenticate(secret) is principal  # served from the cache
    await access.admit(ticket(principal, 1, 1, model="a"))
    await access.store.update(principal.key_id, KeyUpdate(models=["b"]))
    with pytest.raises(PermissionDenied) as denied:
        await access.admit(ticket(principal, 1, 1, model="a"))
    assert denied.value.code == "model_not_allowed"
    await access.store.update(principal.key_id, KeyUpdate(disabled=True))
    with pytest.raises(AuthenticationError, match="disabled"):
        await access.admit(ticket(principal, 1, 1, model="b"))
    await access.store.update(principal.key_id, KeyUpdate(disabled=False))
    clock.now += 3600
    with pytest.raises(AuthenticationError, match="expired"):
        await access.admit(ticket(principal, 1, 1, model="b"))
    clock.now -= 3600
    rotated, _ = await access.store.rotate(principal.key_id)
    with pytest.raises(AuthenticationError, match="has been rotated: use its new secret"):
        await access.admit(ticket(principal, 1, 1, model="b"))
    fresh = await access.authenticate(rotated)
    await access.admit(ticket(fresh, 1, 1, model="b"))


def test_require_model() -> None:
    require_model(Principal("k", "n", None), "any")
    require_model(Principal("k", "n", frozenset({"a"})), "a")
    with pytest.raises(PermissionDenied) as err:
        require_model(Principal("k", "n", frozenset({"a"})), "b")
    assert err.value.code == "model_not_allowed" and err.value.param == "model"


async def test_budget_reserves_worst_case_clips_then_refuses(
    access: RedisAccessControl, redis: Redis
) -> None:
    _, principal = await make_key(access, budget_tokens=1000)
    first = await access.admit(ticket(principal, 100, 500))
    assert (first.max_tokens, first.reserved_tokens) == (500, 600)
    clipped = await access.admit(ticket(principal, 100, 500))
    assert (clipped.max_tokens, clipped.reserved_tokens) == (300, 400)
    with pytest.raises(QuotaExceeded) as err:
        await access.admit(ticket(principal, 1, 1))
    assert err.value.status == 429 and err.value.code == "insufficient_quota"
    await settle(access, first, 100, 50)  # 450 of 600 released
    assert await spent(access, redis, principal.key_id, "all") == 150
    third = await access.admit(ticket(principal, 100, 500))
    assert third.max_tokens == 1000 - 150 - 400 - 100
    with pytest.raises(QuotaExceeded):  # the prompt alone no longer fits
        await access.admit(ticket(principal, 100, 10))


async def test_charge_never_exceeds_reservation_or_budget(
    access: RedisAccessControl, redis: Redis
) -> None:
    _, principal = await make_key(access, budget_tokens=100)
    grant = await access.admit(ticket(principal, 10, 90))
    await settle(access, grant, 400, 90)  # the upstream counted far more prompt tokens
    assert await spent(access, redis, principal.key_id, "all") == 100
    with pytest.raises(QuotaExceeded):
        await access.admit(ticket(principal, 0, 1))
    entries = await redis.xrange(access.store.space.usage_log())
    assert entries[-1][1][b"prompt_tokens"] == b"400"
    assert entries[-1][1][b"charged_tokens"] == b"100"


async def test_concurrent_admissions_never_overcommit_the_budget(
    access: RedisAccessControl, redis: Redis
) -> None:
    _, principal = await make_key(access, budget_tokens=1000)
    results = await asyncio.gather(
        *(access.admit(ticket(principal, 20, 80)) for _ in range(40)), return_exceptions=True
    )
    grants = [r for r in results if isinstance(r, Grant)]
    assert len(grants) == 10
    assert all(isinstance(r, QuotaExceeded) for r in results if not isinstance(r, Grant))
    await asyncio.gather(*(settle(access, g, 20, 80) for g in grants))
    assert await spent(access, redis, principal.key_id, "all") == 1000


async def test_daily_budget_resets_next_utc_day(
    access: RedisAccessControl, redis: Redis, clock: Clock
) -> None:
    _, principal = await make_key(access, budget_tokens=100, budget_period="day")
    await settle(access, await access.admit(ticket(principal, 50, 50)), 50, 50)
    assert await spent(access, redis, principal.key_id, "2026-11-29") == 100
    with pytest.raises(QuotaExceeded):
        await access.admit(ticket(principal, 1, 1))
    clock.now += 86_400
    grant = await access.admit(ticket(principal, 50, 50))
    assert grant.max_tokens == 50


async def test_rpm_window_retry_after_and_headers(access: RedisAccessControl, clock: Clock) -> None:
    _, principal = await make_key(access, rpm=2)
    first = await access.admit(ticket(principal, 1, 1))
    assert first.headers == {
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "50s",
    }
    clock.now += 20.3  # 30.3 s into the minute
    second = await access.admit(ticket(principal, 1, 1))
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(RateLimited) as err:
        await access.admit(ticket(principal, 1, 1))
    assert err.value.retry_after == 30 and err.value.headers["Retry-After"] == "30"
    assert err.value.code == "rate_limit_exceeded"
    assert err.value.headers["x-ratelimit-remaining-requests"] == "0"
    clock.now += 29.7  # the next minute
    await access.admit(ticket(principal, 1, 1))


async def test_tpm_reserves_then_gives_back_unused_tokens(
    access: RedisAccessControl, clock: Clock
) -> None:
    _, principal = await make_key(access, tpm=1000)
    first = await access.admit(ticket(principal, 100, 500))
    assert first.headers["x-ratelimit-remaining-tokens"] == "400"
    with pytest.raises(RateLimited) as err:
        await access.admit(ticket(principal, 100, 500))
    assert err.value.retry_after == 50
    await settle(access, first, 100, 100)  # 400 tokens back to the window
    second = await access.admit(ticket(principal, 100, 500))
    assert second.headers["x-ratelimit-remaining-tokens"] == "200"
    with pytest.raises(RateLimited):  # clipped to the limit, still more than the window left
        await access.admit(ticket(principal, 10, 5000))
    clock.now += 60
    too_big = await access.admit(ticket(principal, 10, 5000))
    assert too_big.max_tokens == 990 and too_big.headers["x-ratelimit-remaining-tokens"] == "0"
    with pytest.raises(RateLimited) as err:
        await access.admit(ticket(principal, 2000, 1))
    assert err.value.code == "request_too_large"


async def test_concurrency_slots_release_on_settle_and_expire_when_a_replica_dies(
    access: RedisAccessControl, redis: Redis, clock: Clock
) -> None:
    _, principal = await make_key(access, max_concurrency=2, budget_tokens=10_000)
    one = await access.admit(ticket(principal, 10, 10))
    await access.admit(ticket(principal, 10, 10))  # never settled: its replica "dies"
    with pytest.raises(RateLimited) as err:
        await access.admit(ticket(principal, 10, 10))
    assert err.value.code == "concurrency_limit_exceeded" and err.value.retry_after == 1
    await settle(access, one, 10, 10)
    three = await access.admit(ticket(principal, 10, 10))
    assert await redis.hget(access.store.space.held(principal.key_id), "_sum") == b"40"
    await settle(access, three, 10, 10)
    clock.now += 301  # past the dead request's deadline: slot and reservation are freed
    await access.admit(ticket(principal, 10, 10))
    await access.admit(ticket(principal, 10, 10))
    assert await redis.zcard(access.store.space.slots(principal.key_id)) == 2
    assert await redis.hget(access.store.space.held(principal.key_id), "_sum") == b"40"


async def test_a_dead_replicas_reservation_is_freed_when_the_budget_needs_it(
    access: RedisAccessControl, redis: Redis, clock: Clock
) -> None:
    _, principal = await make_key(access, budget_tokens=100)
    await access.admit(ticket(principal, 10, 80))  # never settled: its replica "dies"
    clipped = await access.admit(ticket(principal, 5, 50))
    assert clipped.max_tokens == 5  # only 10 left while the dead reservation counts
    await settle(access, clipped, 5, 0)
    clock.now += 301
    full = await access.admit(ticket(principal, 5, 50))
    assert full.max_tokens == 50  # the dead reservation is gone once it made a difference
    held = access.store.space.held(principal.key_id)
    assert await redis.hget(held, "_sum") == b"55"
    assert await redis.zcard(access.store.space.slots(principal.key_id)) == 1


async def test_dead_slots_are_swept_now_and_then_even_without_limits_that_need_it(
    access: RedisAccessControl, redis: Redis, clock: Clock
) -> None:
    _, principal = await make_key(access)
    await access.admit(ticket(principal, 10, 10))  # never settled
    sweeping_ms = (int((clock.now + 301) * 1000) // 32 + 1) * 32  # an admission that sweeps
    clock.now = (sweeping_ms + 0.5) / 1000
    live = await access.admit(ticket(principal, 10, 10))
    assert await redis.zrange(access.store.space.slots(principal.key_id), 0, -1) == [
        live.token.encode()
    ]


async def test_settlement_records_usage_in_capped_stream_and_counters(
    access: RedisAccessControl, redis: Redis, clock: Clock
) -> None:
    _, principal = await make_key(access)
    grant = await access.admit(ticket(principal, 10, 100, model="a"))
    outcome = Outcome(
        Usage(10, 7, reasoning_tokens=3, cached_prompt_tokens=4),
        200,
        provider="mock",
        route_model="echo",
        thinking=True,
        latency_ms=12.5,
        ttft_ms=3.0,
    )
    await access.settle(grant, outcome)
    ((_, entry),) = await redis.xrange(access.store.space.usage_log())
    assert entry[b"request_id"] == grant.ticket.request_id.encode()
    assert entry[b"key_id"] == principal.key_id.encode() and entry[b"model"] == b"a"
    assert (entry[b"provider"], entry[b"route_model"], entry[b"thinking"]) == (
        b"mock",
        b"echo",
        b"on",
    )
    assert (entry[b"completion_tokens"], entry[b"reasoning_tokens"]) == (b"7", b"3")
    assert (entry[b"cached_tokens"], entry[b"ttft_ms"], entry[b"status"]) == (b"4", b"3.0", b"200")
    failed = Outcome(Usage(10, 2), 502, error_code="upstream_error")
    for model in ("a", "b", "b", "b"):
        clock.now += 86_400 if model == "b" else 0
        await access.settle(await access.admit(ticket(principal, 10, 10, model=model)), failed)
    assert await redis.xlen(access.store.space.usage_log()) == 3

    reader = UsageReader(redis, prefix=access.store.space.prefix)
    report = await reader.query(UsageQuery(group_by="day"))
    assert report["totals"] == {
        "requests": 5,
        "prompt_tokens": 50,
        "completion_tokens": 15,
        "reasoning_tokens": 3,
        "cached_tokens": 4,
        "errors": 4,
    }
    assert [(row["day"], row["requests"]) for row in report["data"]] == [
        ("2026-11-29", 2),
        ("2026-11-30", 1),
        ("2026-12-01", 1),
        ("2026-12-02", 1),
    ]
    by_model = await reader.query(UsageQuery(model="b", group_by="model"))
    assert [(r["model"], r["errors"]) for r in by_model["data"]] == [("b", 3)]
    window = UsageQuery.model_validate({"start": "2026-11-30", "end": "2026-12-01T23:00:00Z"})
    assert (await reader.query(window))["totals"]["requests"] == 2
    by_key = await reader.query(UsageQuery(key_id="key_other", group_by="key"))
    assert by_key["totals"]["requests"] == 0 and by_key["data"] == []
    mine = await reader.query(UsageQuery(key_id=principal.key_id, group_by="key"))
    assert mine["data"] == [{"key_id": principal.key_id, **report["totals"]}]


async def test_concurrent_misses_share_one_lookup(access: RedisAccessControl) -> None:
    secret, _ = await access.store.create(KeyCreate(name="herd"))
    calls = 0
    lookup = access.store.lookup

    async def counting(token: str) -> KeyRecord | None:
        nonlocal calls
        calls += 1
        return await lookup(token)

    access.store.lookup = counting  # type: ignore[method-assign]
    principals = await asyncio.gather(*(access.authenticate(secret) for _ in range(20)))
    assert calls == 1 and len({p.key_id for p in principals}) == 1
    bad = "sk-" + "y" * 43
    results = await asyncio.gather(
        *(access.authenticate(bad) for _ in range(5)), return_exceptions=True
    )
    assert calls == 2 and all(isinstance(r, AuthenticationError) for r in results)


async def test_a_lone_request_writes_its_scripts_at_once_and_a_busy_process_per_tick(
    access: RedisAccessControl, script_writes: list[int]
) -> None:
    """With no other request under way nothing would join an admission or a settlement, so
    each is written as it is made; with another under way, they wait for the loop tick's write."""
    _, principal = await make_key(access, rpm=100, max_concurrency=5)
    await settle(access, await access.admit(ticket(principal, 5, 5)), 5, 1)  # connected
    script_writes.clear()  # from here on
    lone = access.admit(ticket(principal, 5, 5))
    assert script_writes == [1]  # written before the tick ended
    first = await lone
    second = access.admit(ticket(principal, 5, 5))  # `first` is still under way
    assert script_writes == [1]
    second_grant = await second
    assert script_writes == [1, 1]
    landed = access.settle(first, Outcome(Usage(5, 1), 200))  # `second` still under way
    assert script_writes == [1, 1]
    await landed
    last = access.settle(second_grant, Outcome(Usage(5, 1), 200))  # the last one under way
    assert script_writes == [1, 1, 1, 1]
    await last
