"""Admission and settlement against a key's budget, rate limits and concurrency cap.

Each runs in a Lua script (atomic in Redis), so concurrent requests on any number of replicas can
never over-admit. The admissions a process makes in one event-loop tick go to Redis as one script
call, which decides each in turn exactly as separate calls would, reading once what they share
and writing it once (about half of Redis's CPU per request at 64 clients); so do its
settlements. Rules:
  - admission reserves the worst case, prompt + max_tokens, against the budget (spent plus
    in-flight reservations), the TPM window and the concurrency cap, and counts the request in
    the RPM window. When the budget left is smaller than that but larger than the prompt, the
    request is admitted with max_tokens clipped to what is left (the stream ends with "length");
    a key's TPM limit clips max_tokens the same way.
  - settlement charges prompt + completion tokens, capped at the reservation and at the budget
    left: the tokens charged against a budget never exceed it, even when an upstream counts
    more prompt tokens than estimated (the usage record keeps the upstream's true counts).
  - a cost budget works the same way in millionths of the currency: admission reserves the
    worst-case cost (prompt tokens at the dearest input price of the request's routes, plus
    max_tokens at the dearest output price), clipping max_tokens to what the cost left allows;
    settlement charges the actual cost, capped at that reservation and at the budget left.
  - RPM and TPM use fixed one-minute UTC windows; Retry-After is the time to the next window.
  - every in-flight request holds a slot, a lease of `slot_lease_s` that its process renews
    (`renew`, every live slot of the process in one call); slots (and their reservations) of a
    replica that died or lost Redis are dropped once their lease has run out.
  - settlement is idempotent by request token (a retry never charges twice), and an admission
    the gateway gave up on is undone by `release`, even when Redis runs it later.
  - a refusal for budget or rate (429) is recorded in usage like a settlement (`reserved` =
    `REFUSED`): its record has no tokens, its status and error code; nothing is charged or
    released; recorded once per refusal token.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.errors import (
    AuthenticationError,
    GatewayError,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
)
from gateway.keys.script_batch import Arg, BatchedScript, Script, ScriptBatcher
from gateway.keys.store import KeySpace, batched_lua, lua, text
from gateway.keys.usage import RECORD_FIELDS, UsageEntry
from plumbing.busy_wait import BusyWait
from plumbing.record import record

_WINDOW_MS = 60_000
_DAY_SPENT_TTL_MS = 2 * 86_400_000
_MONTH_SPENT_TTL_MS = 62 * 86_400_000
# How long the slots, held and gone hashes outlive their last write: a spooled settlement
# replayed within this long after its request is still recorded exactly once.
KEEP_MS = 7 * 86_400_000
_NAMES_KEPT = 10_000  # keys whose Redis key names are kept built
REFUSED = -1  # a Settlement's `reserved` for a refusal: recorded, nothing charged or released
# How long a refusal's once-marker is kept: a retry of its record later than this (Redis took it
# but its answer was lost, then Redis was away for longer) would record it again.
REFUSAL_ONCE_MS = 3_600_000


@dataclass(slots=True)
class _KeyNames:
    """One key's Redis key names on one UTC day; `rpm` and `tpm` still want the minute, and
    `admit_keys` is what admission passes in one minute (mutable: built once per minute)."""

    key: str
    slots: str
    held: str
    gone: str
    spent: tuple[str, str, str]  # all time, the day, the month
    spent_cost: tuple[str, str, str]  # the same, for the cost budget
    rpm: str
    tpm: str
    minute: int = -1  # the minute that `admit_keys` is for
    admit_keys: tuple[str, ...] = ()  # what admit.lua is passed, in that minute


def _result(reply: Any) -> Any:
    """The future's value for a reply as it is: raises an error reply."""
    if isinstance(reply, BaseException):
        raise reply
    return reply


@record
class Admission:
    max_tokens: int
    reserved_tokens: int
    token: str  # "{slot id}.{minute}": what settlement needs to find the reservation
    headers: dict[str, str]
    reserved_cost: int = 0  # millionths of the currency, held against a cost budget


@record
class Settlement:
    """One request's settlement, as sent to Redis and as kept in the spool (JSON)."""

    key_id: str
    token: str
    reserved: int
    used: int
    entry: UsageEntry
    reserved_cost: int = 0  # millionths of the currency (see Admission)
    used_cost: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Settlement:
        return cls(**{**data, "entry": UsageEntry(**data["entry"])})


def minute_of(token: str) -> int:
    return int(token.rsplit(".", 1)[1])


def _reset(ms: int) -> str:
    return f"{math.ceil(ms / 1000)}s"


def ratelimit_headers(kind: str, limit: int, left: int, reset_ms: int) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for `requests` or `tokens`."""
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(max(left, 0)),
        f"x-ratelimit-reset-{kind}": _reset(reset_ms),
    }


class Limiter:
    def __init__(
        self,
        redis: Redis,
        space: KeySpace,
        *,
        usage_stream_maxlen: int,
        slot_lease_s: float,
        timeout_s: float = 5.0,
        busy: BusyWait | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._space = space
        self.lease_ms = int(slot_lease_s * 1000)
        self._clock = clock
        self._scripts = ScriptBatcher(redis, timeout_s=timeout_s, busy=busy)
        self._admit = BatchedScript(Script.of(batched_lua("admit.lua")), (self.lease_ms, KEEP_MS))
        self._settle = BatchedScript(
            Script.of(batched_lua("settle.lua")),
            (_DAY_SPENT_TTL_MS, _MONTH_SPENT_TTL_MS, usage_stream_maxlen, REFUSAL_ONCE_MS),
        )
        self._release = Script.of(lua("release.lua"))
        self._renew = Script.of(lua("renew.lua"))
        # Reservation tokens: unique across replicas (a random prefix per process) and cheap.
        self._token_prefix = secrets.token_hex(8)
        self._token_seq = itertools.count()
        self._day = -1  # the UTC day number that `_names_of` is for
        self._names_of: dict[str, _KeyNames] = {}

    def _names(self, key_id: str, now_s: float) -> _KeyNames:
        """The names of `key_id`'s Redis keys on the UTC day of `now_s`, built once per key and
        day (formatting them per request is a measurable share of a request's CPU)."""
        day_number = int(now_s // 86_400)
        if day_number != self._day:
            self._day, self._names_of = day_number, {}
        names = self._names_of.get(key_id)
        if names is None:
            if len(self._names_of) >= _NAMES_KEPT:
                self._names_of.clear()
            day = time.strftime("%Y-%m-%d", time.gmtime(now_s))
            s = self._space
            names = self._names_of[key_id] = _KeyNames(
                key=s.key(key_id),
                slots=s.slots(key_id),
                held=s.held(key_id),
                gone=s.gone(key_id),
                spent=(s.spent(key_id, "all"), s.spent(key_id, day), s.spent(key_id, day[:7])),
                spent_cost=(
                    s.spent_cost(key_id, "all"),
                    s.spent_cost(key_id, day),
                    s.spent_cost(key_id, day[:7]),
                ),
                rpm=s.window_prefix("rpm", key_id),
                tpm=s.window_prefix("tpm", key_id),
            )
        return names

    async def aclose(self) -> None:
        await self._scripts.aclose()

    def token(self, now_s: float) -> str:
        """A new request token, "{slot id}.{minute}", for an admission at `now_s`."""
        minute = int(now_s * 1000) // _WINDOW_MS
        return f"{self._token_prefix}{next(self._token_seq):x}.{minute}"

    def admit(
        self,
        token: str,
        now_s: float,
        key_id: str,
        digest: str,
        model: str,
        prompt_tokens: int,
        max_tokens: int,
        then: Callable[[Any], Any] = _result,
        *,
        at_once: bool = False,
        token_cost: tuple[float, float] = (0.0, 0.0),
    ) -> asyncio.Future[Any]:
        """Check the key as it is in Redis now (revoked, rotated, disabled, expired, model not
        allowed), then reserve under `token` (from `token(now_s)`); one script call (sent as
        `ScriptBatcher.run` says). `token_cost`: the worst-case cost of a prompt token and of
        an output token, in millionths of the currency (a price per million tokens). The future
        holds the Admission, or raises the refusal or failure; with `then`, what `then` makes of
        either (called as the reply is read)."""
        now_ms = int(now_s * 1000)
        minute = minute_of(token)
        reset_ms = (minute + 1) * _WINDOW_MS - now_ms
        n = self._names(key_id, now_s)
        keys = n.admit_keys
        if n.minute != minute:
            n.minute = minute
            keys = n.admit_keys = (
                n.key,
                n.slots,
                n.held,
                f"{n.rpm}{minute}",
                f"{n.tpm}{minute}",
                *n.spent,
                n.gone,
                *n.spent_cost,
            )
        prompt, wanted = max(prompt_tokens, 0), max(max_tokens, 1)
        args = (now_ms, token, prompt, wanted, reset_ms, digest, model, *token_cost)

        def parse(reply: Any) -> Any:
            if not isinstance(reply, BaseException):
                try:
                    reply = _admission(reply, token, reset_ms, model, prompt_tokens)
                except (GatewayError, RedisTimeoutError) as refused:
                    reply = refused
            return then(reply)

        return self._scripts.run_item(self._admit, keys, args, parse, at_once=at_once)

    def settle(self, settlement: Settlement, *, at_once: bool = False) -> asyncio.Future[int]:
        """Release the reservation, charge the tokens used, record the usage entry; the tokens
        charged, or -1 when this settlement had been applied before. A refusal (`reserved` =
        `REFUSED`, with a token of its own from `token`) is only recorded. Sent as
        `ScriptBatcher.run` says."""
        key_id, token, entry = settlement.key_id, settlement.token, settlement.entry
        n = self._names(key_id, self._clock())
        s = self._space
        refused = settlement.reserved == REFUSED
        keys = (
            n.key,
            n.slots,
            n.held,
            s.refused(token) if refused else f"{n.tpm}{minute_of(token)}",
            *n.spent,
            s.usage_day(entry.day),
            s.usage_days(),
            s.usage_log(),
            n.gone,
            *n.spent_cost,
        )
        record = entry.record
        args = [token, settlement.reserved, max(settlement.used, 0), entry.day, entry.counters]
        args += [record.get(field, "") for field in RECORD_FIELDS]
        args += [settlement.reserved_cost, max(settlement.used_cost, 0)]
        return self._scripts.run_item(self._settle, keys, args, at_once=at_once)

    async def release(self, key_id: str, token: str) -> bool:
        """Undo an admission the gateway gave up on, or bar it from landing later; True when
        one was undone."""
        s, minute = self._space, minute_of(token)
        keys = [
            s.slots(key_id),
            s.held(key_id),
            s.window("rpm", key_id, minute),
            s.window("tpm", key_id, minute),
            s.gone(key_id),
        ]
        return bool(await self._scripts.run(self._release, keys, [token, KEEP_MS]))

    async def renew(self, live: dict[str, list[str]]) -> int:
        """Extend the leases of live requests (key id -> tokens) to a full lease from now, in
        one call; the number of slots renewed."""
        if not live:
            return 0
        keys = [self._space.slots(key_id) for key_id in live]
        args: list[Arg] = [int(self._clock() * 1000) + self.lease_ms]
        for tokens in live.values():
            args += (len(tokens), *tokens)
        return int(await self._scripts.run(self._renew, keys, args))


def _admission(
    result: list[Any], token: str, reset_ms: int, model: str, prompt_tokens: int
) -> Admission:
    """admit.lua's reply as an admission, or the refusal it stands for (raised)."""
    if result[0] == 0:
        _, grant, reserved, rpm, rpm_left, tpm, tpm_left, reserved_cost = result
        headers: dict[str, str] = {}
        if rpm != -1:
            headers.update(ratelimit_headers("requests", rpm, rpm_left, reset_ms))
        if tpm != -1:
            headers.update(ratelimit_headers("tokens", tpm, tpm_left, reset_ms))
        return Admission(grant, reserved, token, headers, reserved_cost)
    match [text(v) if isinstance(v, bytes) else str(v) for v in result]:
        case ["1", "rotated"]:
            raise AuthenticationError("This API key has been rotated: use its new secret.")
        case ["1", why]:
            raise AuthenticationError(f"This API key has been {why}.")
        case ["4"]:
            message = f"This API key may not use the model '{model}'."
            raise PermissionDenied(message, param="model", code="model_not_allowed")
        case ["2", left]:
            raise QuotaExceeded(
                f"This API key's token budget is exhausted ({left} tokens left, the prompt "
                f"alone needs about {prompt_tokens}).",
            )
        case ["6", left, prompt_cost]:
            raise QuotaExceeded(
                f"This API key's cost budget is exhausted ({int(left) / 1e6:.6f} left, the "
                f"prompt alone costs about {int(prompt_cost) / 1e6:.6f} and the answer needs "
                "room for at least one token).",
                code="cost_budget_exceeded",
            )
        case ["3", retry_ms, limit_name, limit]:
            raise _rate_limited(limit_name, int(limit), int(retry_ms), prompt_tokens)
        case ["5"]:  # released after the gateway gave up on it: the client had its 503
            raise RedisTimeoutError("This admission was abandoned and released.")
    raise AssertionError(f"unexpected admission result {result!r}")


def _rate_limited(name: str, limit: int, retry_ms: int, prompt_tokens: int) -> RateLimited:
    retry = max(1, math.ceil(retry_ms / 1000))
    if name == "concurrency":
        return RateLimited(
            f"Too many concurrent requests for this API key (limit {limit}).",
            retry_after=retry,
            code="concurrency_limit_exceeded",
        )
    if name == "tpm_request":
        return RateLimited(
            f"Request too large: the prompt needs about {prompt_tokens} tokens, more than this "
            f"API key's limit of {limit} tokens per minute.",
            retry_after=retry,
            code="request_too_large",
        )
    kind = "requests" if name == "rpm" else "tokens"
    return RateLimited(
        f"Rate limit reached: {limit} {kind} per minute for this API key. Try again in {retry}s.",
        retry_after=retry,
        headers=ratelimit_headers(kind, limit, 0, retry_ms),
    )
