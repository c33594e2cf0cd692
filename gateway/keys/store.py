"""API keys in Redis: create, read, change, revoke, rotate, and look up by secret.

Layout (all under the configured prefix, see `KeySpace`):
  key:{id}            hash: `record` (the KeyRecord JSON), `digest`, what admission re-checks
                      (`disabled`, `expires_ms`, `models` as "\nm1\nm2\n") and the limits the
                      Lua scripts read (`rpm`, `tpm`, `conc`, `budget`, `period`, and the cost
                      budget in millionths of the currency, `cbudget`, with `cperiod`; absent =
                      none)
  key-digest:{sha256} string: the key id, so a secret is found by its digest
  keys                set of key ids
  keys-revoked        hash: key id -> {"record", "revoked" (epoch ms)} of every revoked key, so
                      that its name and the moment it was revoked can still be shown
  refused:{token}     a refusal's record once-marker (see limiter.REFUSED), kept an hour
  key-retired:{sha256} string: "{rotated|revoked}:{epoch ms}" for a secret that stopped working,
                      kept `RETIRED_KEEP_S`, so that its refusal can say why
Secrets (`sk-` + 43 url-safe characters) are returned once by `create` and `rotate` and never
stored: only their SHA-256 digest is.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources

from redis.asyncio import Redis
from redis.exceptions import WatchError

from gateway.errors import InvalidRequest, NotFound
from gateway.keys.records import KeyCreate, KeyRecord, KeyUpdate

SECRET_PREFIX = "sk-"
RETIRED_KEEP_S = 90 * 86_400  # how long a rotated or revoked secret's refusal says why


def lua(name: str) -> str:
    """The source of one of this package's Lua scripts."""
    return resources.files("gateway.keys").joinpath("lua", name).read_text(encoding="utf-8")


def batched_lua(name: str) -> str:
    """A batched script's source: batch.lua (how its items arrive), then the script itself."""
    return lua("batch.lua") + lua(name)


def text(value: bytes | str) -> str:
    """A Redis reply as text (the client may or may not decode replies)."""
    return value.decode() if isinstance(value, bytes) else value


def digest(secret: str) -> str:
    # surrogateescape: a header's bytes that are not UTF-8 arrive as lone surrogates; they
    # hash like any other text (and match no key) instead of failing to encode.
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


class KeySpace:
    """Names of every Redis key this package uses, under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def key(self, key_id: str) -> str:
        return f"{self.prefix}key:{key_id}"

    def digest(self, hexdigest: str) -> str:
        return f"{self.prefix}key-digest:{hexdigest}"

    def ids(self) -> str:
        return f"{self.prefix}keys"

    def revoked(self) -> str:
        return f"{self.prefix}keys-revoked"

    def refused(self, token: str) -> str:
        return f"{self.prefix}refused:{token}"

    def retired(self, hexdigest: str) -> str:
        return f"{self.prefix}key-retired:{hexdigest}"

    def slots(self, key_id: str) -> str:
        """ZSET: in-flight request token -> deadline (ms); expired members are dead replicas'."""
        return f"{self.prefix}slots:{key_id}"

    def held(self, key_id: str) -> str:
        """HASH: in-flight request token -> reserved tokens, and `_sum` of them."""
        return f"{self.prefix}held:{key_id}"

    def gone(self, key_id: str) -> str:
        """HASH: request token -> `void` (an admission the gateway gave up on and released) or
        `lapsed` (a slot swept after its lease ran out, its settlement not yet recorded)."""
        return f"{self.prefix}gone:{key_id}"

    def window(self, kind: str, key_id: str, minute: int) -> str:
        """Counter of requests (`rpm`) or tokens (`tpm`) in one UTC minute."""
        return f"{self.window_prefix(kind, key_id)}{minute}"

    def window_prefix(self, kind: str, key_id: str) -> str:
        """`window(kind, key_id, minute)` without the minute."""
        return f"{self.prefix}{kind}:{key_id}:"

    def spent(self, key_id: str, stamp: str) -> str:
        """Tokens charged against the budget in one period (`all`, `2026-11-29`, `2026-11`)."""
        return f"{self.prefix}spent:{key_id}:{stamp}"

    def spent_cost(self, key_id: str, stamp: str) -> str:
        """Cost charged against the cost budget in one period, in millionths of the currency."""
        return f"{self.prefix}spent-cost:{key_id}:{stamp}"

    def usage_day(self, day: str) -> str:
        """HASH: `{key_id}|{metric}|{model}` -> count, for one UTC day."""
        return f"{self.prefix}usage:{day}"

    def usage_days(self) -> str:
        return f"{self.prefix}usage-days"

    def usage_log(self) -> str:
        return f"{self.prefix}usage-log"


def _hash(record: KeyRecord, hexdigest: str) -> dict[str, str]:
    """The hash fields stored for a record: the JSON plus the limits Lua reads."""
    fields = {"record": record.model_dump_json(), "digest": hexdigest}
    # What admission re-checks on every request (the authenticate cache may be seconds old).
    if record.disabled:
        fields["disabled"] = "1"
    if record.expires_at is not None:
        fields["expires_ms"] = str(int(record.expires_at.timestamp() * 1000))
    if record.models is not None:
        fields["models"] = "\n" + "".join(f"{m}\n" for m in record.models)
    limits = {
        "rpm": record.rpm,
        "tpm": record.tpm,
        "conc": record.max_concurrency,
        "budget": record.budget_tokens,
    }
    fields.update({name: str(value) for name, value in limits.items() if value is not None})
    if record.budget_tokens is not None:
        fields["period"] = record.budget_period or "all"
    if record.budget_cost is not None:
        fields["cbudget"] = str(micros(record.budget_cost))
        fields["cperiod"] = record.budget_cost_period or "all"
    return fields


@dataclass(frozen=True)
class Retired:
    """A secret that no longer works: why ("rotated" or "revoked") and since when."""

    why: str
    at: datetime


@dataclass(frozen=True)
class RevokedKey:
    record: KeyRecord
    revoked: datetime


def micros(cost: float) -> int:
    """A cost in millionths of the currency, as the Lua scripts count it (to the nearest)."""
    return round(cost * 1_000_000)


class KeyStore:
    def __init__(
        self, redis: Redis, *, prefix: str, clock: Callable[[], float] = time.time
    ) -> None:
        self._redis = redis
        self.space = KeySpace(prefix)
        self._clock = clock
        self._lookup = redis.register_script(lua("lookup.lua"))

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    def _check_expiry(self, record: KeyRecord) -> None:
        if record.is_expired(self._now()):
            raise InvalidRequest("expires_at must be in the future.", param="expires_at")

    async def create(self, body: KeyCreate) -> tuple[str, KeyRecord]:
        """A new key: its secret (show it once) and its record."""
        secret = new_secret()
        record = KeyRecord(
            **body.model_dump(),
            id="key_" + secrets.token_hex(12),
            created=self._now(),
            hint=secret[-4:],
        )
        self._check_expiry(record)
        hexdigest = digest(secret)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.space.key(record.id), mapping=_hash(record, hexdigest))  # type: ignore[arg-type]
            pipe.set(self.space.digest(hexdigest), record.id)
            pipe.sadd(self.space.ids(), record.id)
            await pipe.execute()
        return secret, record

    async def lookup(self, secret: str) -> KeyRecord | None:
        """The record of the key with this secret (one round trip), or None."""
        key = self.space.digest(digest(secret))
        raw = await self._lookup(keys=[key], args=[self.space.key("")])
        return None if raw is None else KeyRecord.model_validate_json(raw)

    async def retired(self, secret: str) -> Retired | None:
        """Why a secret that `lookup` does not know stopped working, if it was one of ours
        (rotated or revoked in the last `RETIRED_KEEP_S`)."""
        raw = await self._redis.get(self.space.retired(digest(secret)))
        if raw is None:
            return None
        why, _, ms = text(raw).partition(":")
        return Retired(why, datetime.fromtimestamp(int(ms) / 1000, UTC))

    async def revoked(self, key_id: str) -> RevokedKey | None:
        """The record of a revoked key and when it was revoked, or None."""
        raw = await self._redis.hget(self.space.revoked(), key_id)
        return None if raw is None else _revoked(raw)

    async def names(self) -> dict[str, str]:
        """Key id -> name of every key, revoked ones included."""
        raws = await self._redis.hgetall(self.space.revoked())
        names = {text(k): _revoked(v).record.name for k, v in raws.items()}
        names.update({r.id: r.name for r in await self.list()})
        return names

    async def get(self, key_id: str) -> KeyRecord:
        raw = await self._redis.hget(self.space.key(key_id), "record")
        if raw is None:
            raise NotFound(f"No API key with id '{key_id}'.", param="id")
        return KeyRecord.model_validate_json(raw)

    async def list(self) -> list[KeyRecord]:
        """Every key, oldest first."""
        ids = sorted(await self._redis.smembers(self.space.ids()))
        async with self._redis.pipeline(transaction=False) as pipe:
            for key_id in ids:
                pipe.hget(self.space.key(text(key_id)), "record")
            raws = await pipe.execute()
        records = [KeyRecord.model_validate_json(raw) for raw in raws if raw is not None]
        return sorted(records, key=lambda r: (r.created, r.id))

    async def update(self, key_id: str, patch: KeyUpdate) -> KeyRecord:
        """Apply a PATCH atomically (optimistic: retried if the key changed meanwhile)."""

        def change(record: KeyRecord, hexdigest: str) -> tuple[KeyRecord, str, str | None]:
            new = record.updated(patch)
            if "expires_at" in patch.model_fields_set:
                self._check_expiry(new)
            return new, hexdigest, None

        return await self._rewrite(key_id, change)

    async def rotate(self, key_id: str) -> tuple[str, KeyRecord]:
        """A new secret for the key; the old one stops working at once."""
        secret = new_secret()

        def change(record: KeyRecord, hexdigest: str) -> tuple[KeyRecord, str, str | None]:
            return record.model_copy(update={"hint": secret[-4:]}), digest(secret), hexdigest

        return secret, await self._rewrite(key_id, change)

    async def revoke(self, key_id: str) -> None:
        """Delete the key; every replica refuses it from the next request on."""
        key = self.space.key(key_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    hexdigest, raw = await pipe.hmget(key, ["digest", "record"])
                    if hexdigest is None or raw is None:
                        raise NotFound(f"No API key with id '{key_id}'.", param="id")
                    now_ms = int(self._clock() * 1000)
                    tombstone = {"record": json.loads(raw), "revoked": now_ms}
                    pipe.multi()
                    pipe.delete(self.space.digest(text(hexdigest)), key)
                    pipe.hset(self.space.revoked(), key_id, json.dumps(tombstone))
                    pipe.set(
                        self.space.retired(text(hexdigest)), f"revoked:{now_ms}", ex=RETIRED_KEEP_S
                    )
                    pipe.delete(self.space.spent(key_id, "all"))
                    pipe.delete(self.space.spent_cost(key_id, "all"))
                    pipe.srem(self.space.ids(), key_id)
                    await pipe.execute()
                    return
                except WatchError:
                    continue

    async def _rewrite(
        self,
        key_id: str,
        change: Callable[[KeyRecord, str], tuple[KeyRecord, str, str | None]],
    ) -> KeyRecord:
        """Read the key, compute (record, digest, old digest to drop) and write it back, all
        under WATCH so concurrent changes are never lost."""
        key = self.space.key(key_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw, old = await pipe.hmget(key, ["record", "digest"])
                    if raw is None or old is None:
                        raise NotFound(f"No API key with id '{key_id}'.", param="id")
                    record, hexdigest, dropped = change(
                        KeyRecord.model_validate_json(raw), text(old)
                    )
                    pipe.multi()
                    pipe.delete(key)
                    pipe.hset(key, mapping=_hash(record, hexdigest))  # type: ignore[arg-type]
                    if dropped is not None:
                        pipe.delete(self.space.digest(dropped))
                        pipe.set(self.space.digest(hexdigest), key_id)
                        pipe.set(
                            self.space.retired(dropped),
                            f"rotated:{int(self._clock() * 1000)}",
                            ex=RETIRED_KEEP_S,
                        )
                    await pipe.execute()
                    return record
                except WatchError:
                    continue


def _revoked(raw: bytes | str) -> RevokedKey:
    data = json.loads(raw)
    return RevokedKey(
        KeyRecord.model_validate(data["record"]),
        datetime.fromtimestamp(data["revoked"] / 1000, UTC),
    )
