"""KeyStore against a real Redis: secrets shown once, digests stored, CRUD, rotate, revoke."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from gateway.errors import InvalidRequest, NotFound
from gateway.keys.records import KeyCreate, KeyRecord, KeyUpdate
from gateway.keys.store import RETIRED_KEEP_S, KeyStore, digest

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture
async def store(redis: Redis) -> AsyncIterator[KeyStore]:
    prefix = f"test:{uuid.uuid4().hex}:"
    yield KeyStore(redis, prefix=prefix, clock=NOW.timestamp)
    keys = [key async for key in redis.scan_iter(match=prefix + "*")]
    if keys:
        await redis.delete(*keys)


async def dump(redis: Redis, prefix: str) -> bytes:
    """Every key name and value under the prefix, concatenated."""
    out = []
    async for key in redis.scan_iter(match=prefix + "*"):
        out.append(key)
        kind = await redis.type(key)
        if kind == b"hash":
            for field, value in (await redis.hgetall(key)).items():
                out += [field, value]
        elif kind == b"set":
            out += list(await redis.smembers(key))
        elif kind == b"string":
            out.append(await redis.get(key))
    return b"\n".join(out)


async def test_create_shows_the_secret_once_and_stores_only_its_digest(
    store: KeyStore, redis: Redis
) -> None:
    secret, record = await store.create(KeyCreate(name="ci", models=["b", "a", "a"], rpm=5))
    assert re.fullmatch(r"sk-[A-Za-z0-9_-]{32,}", secret)
    assert record.name == "ci" and record.models == ["a", "b"] and record.rpm == 5
    assert record.created == NOW and record.hint == secret[-4:]
    stored = await dump(redis, store.space.prefix)
    assert secret.encode() not in stored and secret[3:].encode() not in stored
    assert digest(secret).encode() in stored
    assert secret not in record.model_dump_json()
    assert await redis.get(store.space.digest(digest(secret))) == record.id.encode()


async def test_lookup_compares_digests(store: KeyStore) -> None:
    secret, record = await store.create(KeyCreate(name="a"))
    assert await store.lookup(secret) == record
    assert await store.lookup(secret[:-1] + ("A" if secret[-1] != "A" else "B")) is None
    assert await store.lookup("sk-unknown") is None


async def test_get_list_and_unknown_ids(store: KeyStore) -> None:
    _, first = await store.create(KeyCreate(name="first"))
    _, second = await store.create(KeyCreate(name="second", budget_tokens=10))
    assert await store.get(second.id) == second
    assert [r.id for r in await store.list()] == sorted([first.id, second.id])
    with pytest.raises(NotFound):
        await store.get("key_nope")
    for call in (store.revoke, store.rotate):
        with pytest.raises(NotFound):
            await call("key_nope")
    with pytest.raises(NotFound):
        await store.update("key_nope", KeyUpdate(rpm=1))


async def test_update_changes_only_present_fields_and_null_clears(
    store: KeyStore, redis: Redis
) -> None:
    _, record = await store.create(
        KeyCreate(name="a", rpm=5, tpm=100, budget_tokens=50, metadata={"team": "x"})
    )
    key = store.space.key(record.id)
    assert await redis.hget(key, "rpm") == b"5"
    updated = await store.update(
        record.id, KeyUpdate.model_validate_json('{"rpm": null, "tpm": 7, "disabled": true}')
    )
    assert (updated.rpm, updated.tpm, updated.disabled) == (None, 7, True)
    assert (updated.name, updated.budget_tokens, updated.metadata) == ("a", 50, {"team": "x"})
    assert await redis.hget(key, "rpm") is None and await redis.hget(key, "tpm") == b"7"
    cleared = await store.update(record.id, KeyUpdate.model_validate_json('{"metadata": null}'))
    assert cleared.metadata == {} and await store.get(record.id) == cleared


async def test_update_rejects_a_past_expiry_and_a_period_without_budget(store: KeyStore) -> None:
    _, record = await store.create(KeyCreate(name="a"))
    with pytest.raises(InvalidRequest) as err:
        await store.update(record.id, KeyUpdate(expires_at=NOW - timedelta(seconds=1)))
    assert err.value.param == "expires_at"
    with pytest.raises(ValidationError) as invalid:
        await store.update(record.id, KeyUpdate(budget_period="day"))
    assert invalid.value.errors()[0]["loc"] == ("budget_period",)
    assert await store.get(record.id) == record
    with pytest.raises(InvalidRequest):
        await store.create(KeyCreate(name="b", expires_at=NOW))


async def test_concurrent_updates_lose_nothing(store: KeyStore) -> None:
    _, record = await store.create(KeyCreate(name="a"))
    patches = [KeyUpdate(rpm=1), KeyUpdate(tpm=2), KeyUpdate(max_concurrency=3)] * 4
    await asyncio.gather(*(store.update(record.id, patch) for patch in patches))
    final = await store.get(record.id)
    assert (final.rpm, final.tpm, final.max_concurrency) == (1, 2, 3)


async def test_rotate_replaces_the_secret(store: KeyStore, redis: Redis) -> None:
    old, record = await store.create(KeyCreate(name="a", rpm=9))
    new, rotated = await store.rotate(record.id)
    assert new != old and rotated.id == record.id and rotated.hint == new[-4:]
    assert await store.lookup(old) is None
    assert await store.lookup(new) == rotated and rotated.rpm == 9
    assert await redis.exists(store.space.digest(digest(old))) == 0


async def test_revoke_deletes_key_and_digest(store: KeyStore, redis: Redis) -> None:
    secret, record = await store.create(KeyCreate(name="a"))
    _, kept = await store.create(KeyCreate(name="b"))
    await store.revoke(record.id)
    assert await store.lookup(secret) is None
    with pytest.raises(NotFound):
        await store.get(record.id)
    assert [r.id for r in await store.list()] == [kept.id]
    assert await redis.exists(store.space.key(record.id)) == 0
    with pytest.raises(NotFound):
        await store.revoke(record.id)


async def test_a_record_with_fields_of_a_newer_version_still_reads(
    redis: Redis, redis_prefix: str
) -> None:
    store = KeyStore(redis, prefix=redis_prefix)
    _, record = await store.create(KeyCreate(name="rolling"))
    raw = record.model_dump(mode="json") | {"a_field_of_a_later_version": 1}
    assert KeyRecord.model_validate(raw) == record


async def test_retired_secrets_say_why_and_revoked_keys_keep_their_record(
    store: KeyStore, redis: Redis
) -> None:
    old, record = await store.create(KeyCreate(name="kept-name"))
    new, _ = await store.rotate(record.id)
    rotated = await store.retired(old)
    assert rotated is not None and (rotated.why, rotated.at) == ("rotated", NOW)
    assert await store.retired(new) is None  # a live secret is not retired
    assert await store.retired("sk-never-issued") is None
    await store.revoke(record.id)
    revoked = await store.retired(new)
    assert revoked is not None and (revoked.why, revoked.at) == ("revoked", NOW)
    assert 0 < await redis.ttl(store.space.retired(digest(new))) <= RETIRED_KEEP_S
    tomb = await store.revoked(record.id)
    assert tomb is not None and tomb.record.name == "kept-name" and tomb.revoked == NOW
    assert tomb.record.hint == new[-4:]  # the record as it was when revoked
    assert await store.revoked("key_unknown") is None
    _, live = await store.create(KeyCreate(name="live"))
    assert await store.names() == {record.id: "kept-name", live.id: "live"}
    assert old.encode() not in await dump(redis, store.space.prefix)  # still no secret stored
