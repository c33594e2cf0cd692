"""The Lua contracts that make faults harmless, on the real Redis: settlement applies once per
request token (also after its lease lapsed and was swept), an abandoned admission is undone or
barred from landing, and the spool keeps what Redis could not take across a crash."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.keys.limiter import Limiter, Settlement
from gateway.keys.records import KeyCreate
from gateway.keys.spool import Spool
from gateway.keys.store import KeySpace, KeyStore
from gateway.keys.usage import UsageEntry
from tests.support.clock import START, Clock


@pytest.fixture
async def space(redis: Redis) -> AsyncIterator[KeySpace]:
    prefix = f"test:{uuid.uuid4().hex}:"
    yield KeySpace(prefix)
    keys = [key async for key in redis.scan_iter(match=prefix + "*")]
    if keys:
        await redis.delete(*keys)


@pytest.fixture
async def limiter(redis: Redis, space: KeySpace) -> AsyncIterator[tuple[Limiter, Clock]]:
    clock = Clock()
    limiter = Limiter(redis, space, usage_stream_maxlen=100, slot_lease_s=10, clock=clock)
    yield limiter, clock
    await limiter.aclose()


async def new_key(redis: Redis, space: KeySpace, **limits: int) -> tuple[str, str]:
    store = KeyStore(redis, prefix=space.prefix)
    secret, record = await store.create(KeyCreate(name="t", **limits))
    return record.id, (await redis.hget(space.key(record.id), "digest") or b"").decode()


def settlement(key_id: str, token: str, reserved: int, used: int) -> Settlement:
    entry = UsageEntry(
        day="2026-11-29", counters={f"{key_id}|requests|m": 1}, record={"request_id": token}
    )
    return Settlement(key_id, token, reserved, used, entry)


async def test_a_settlement_applied_twice_charges_and_records_once(
    redis: Redis, space: KeySpace, limiter: tuple[Limiter, Clock]
) -> None:
    lim, _ = limiter
    key_id, digest = await new_key(redis, space, budget_tokens=1000, tpm=10_000)
    token = lim.token(START)
    admission = await lim.admit(token, START, key_id, digest, "m", 10, 40)
    done = settlement(key_id, token, admission.reserved_tokens, 30)
    assert await lim.settle(done) == 30
    assert await lim.settle(done) == -1  # a retry of one that landed
    assert await redis.get(space.spent(key_id, "all")) == b"30"
    assert await redis.xlen(space.usage_log()) == 1
    assert await redis.hget(space.usage_day("2026-11-29"), f"{key_id}|requests|m") == b"1"


async def test_a_settlement_after_its_lease_lapsed_and_was_swept_is_recorded_once(
    redis: Redis, space: KeySpace, limiter: tuple[Limiter, Clock]
) -> None:
    lim, clock = limiter
    key_id, digest = await new_key(redis, space, max_concurrency=1, budget_tokens=1000)
    token = lim.token(START)
    await lim.admit(token, START, key_id, digest, "m", 10, 40)
    clock.now = START + 11  # the lease (10 s) ran out: the next admission sweeps the slot
    later = lim.token(clock.now)
    await lim.admit(later, clock.now, key_id, digest, "m", 10, 40)
    assert await redis.hget(space.gone(key_id), token) == b"lapsed"
    lapsed = settlement(key_id, token, 50, 20)
    assert await lim.settle(lapsed) == 20
    assert await lim.settle(lapsed) == -1
    assert await redis.xlen(space.usage_log()) == 1
    assert await redis.hget(space.held(key_id), "_sum") == b"50"  # only the live one's


async def test_releasing_an_admission_that_ran_undoes_it(
    redis: Redis, space: KeySpace, limiter: tuple[Limiter, Clock]
) -> None:
    lim, _ = limiter
    key_id, digest = await new_key(redis, space, rpm=10, tpm=1000, max_concurrency=1)
    token = lim.token(START)
    await lim.admit(token, START, key_id, digest, "m", 10, 40)
    assert await lim.release(key_id, token) is True
    assert await lim.release(key_id, token) is False  # idempotent: nothing more to undo
    minute = int(START // 60)
    assert await redis.get(space.window("rpm", key_id, minute)) == b"0"
    assert await redis.get(space.window("tpm", key_id, minute)) == b"0"
    assert await redis.zcard(space.slots(key_id)) == 0
    assert await redis.hget(space.held(key_id), "_sum") == b"0"


async def test_an_admission_released_before_it_lands_is_refused_when_it_does(
    redis: Redis, space: KeySpace, limiter: tuple[Limiter, Clock]
) -> None:
    lim, _ = limiter
    key_id, digest = await new_key(redis, space, rpm=10, max_concurrency=1)
    token = lim.token(START)
    assert await lim.release(key_id, token) is False  # barred: it has not run yet
    with pytest.raises(Exception, match="abandoned"):
        await lim.admit(token, START, key_id, digest, "m", 10, 40)
    assert await redis.zcard(space.slots(key_id)) == 0
    assert await redis.get(space.window("rpm", key_id, int(START // 60))) is None


async def test_lease_renewal_moves_live_deadlines_and_never_revives_a_settled_slot(
    redis: Redis, space: KeySpace, limiter: tuple[Limiter, Clock]
) -> None:
    lim, clock = limiter
    key_id, digest = await new_key(redis, space)
    live, settled = lim.token(START), lim.token(START)
    for token in (live, settled):
        await lim.admit(token, START, key_id, digest, "m", 10, 40)
    await lim.settle(settlement(key_id, settled, 50, 10))
    clock.now = START + 5
    assert await lim.renew({key_id: [live, settled]}) == 1
    assert await redis.zscore(space.slots(key_id), live) == (START + 15) * 1000
    assert await redis.zscore(space.slots(key_id), settled) is None


async def test_the_spool_survives_a_crash_and_is_adopted_once(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    kept = [settlement("key_a", f"t{i}.1", 10, 5) for i in range(3)]
    await first.append(kept)
    # The process dies (its lock goes with it) in the middle of writing one more line.
    first.close()
    with first.path.open("a") as file:
        file.write(json.dumps(kept[0].to_json())[:20])
    second = Spool(tmp_path)
    assert await second.adopt() == kept  # the torn line is skipped
    assert not first.path.exists()
    third = Spool(tmp_path)
    assert await third.adopt() == []  # a live process's spool is not taken from it
    second.close()  # it still holds the adopted settlements: kept for the next start
    assert await Spool(tmp_path).adopt() == kept
