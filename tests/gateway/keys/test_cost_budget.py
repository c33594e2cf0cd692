"""Cost budgets: admission reserves the worst-case cost (prompt estimate at the dearest input
price of the request's routes, max_tokens at the dearest output price), clips max_tokens to
what the cost left allows, settlement charges the actual cost capped at that reservation and
at the budget, and nothing overshoots under concurrency. Against a real Redis, with an
injected clock for the limiter, and through the HTTP API with the openai SDK.

Prices in these tests are per million tokens, so one token of a model priced 1000 costs 1000
millionths of the currency (0.001)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from redis.asyncio import Redis

from gateway.access.contract import Grant, Outcome, Principal, Ticket
from gateway.config.usage import UsageSettings
from gateway.errors import QuotaExceeded
from gateway.keys.records import KeyCreate
from gateway.keys.redis_access import RedisAccessControl
from gateway.keys.store import KeySpace, KeyStore
from gateway.usage_store.pricing import Pricing
from providers.types import Usage
from testkit.gateway_app import REDIS_URL
from testkit.mock_upstream import MockUpstream
from tests.support.clock import Clock
from tests.support.configured import configured_gateway
from tests.support.limiter import limiter_access

PRICES = UsageSettings(
    prices={"m": {"input": 1000.0, "output": 2000.0}},
    route_prices={"dear/x": {"input": 500.0, "cached_input": 3000.0, "output": 4000.0}},
)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def access(redis: Redis, clock: Clock, tmp_path: Path) -> AsyncIterator[RedisAccessControl]:
    async with limiter_access(
        redis, clock, tmp_path, pricing=Pricing(PRICES, frozenset())
    ) as access:
        yield access


async def make_key(access: RedisAccessControl, **limits: object) -> Principal:
    secret, _ = await access.store.create(KeyCreate.model_validate({"name": "t", **limits}))
    return await access.authenticate(secret)


def ticket(
    principal: Principal, prompt: int, max_tokens: int, routes: tuple[tuple[str, str], ...] = ()
) -> Ticket:
    return Ticket(principal, "m", f"req_{uuid.uuid4().hex}", prompt, max_tokens, routes=routes)


async def settle(access: RedisAccessControl, grant: Grant, prompt: int, completion: int) -> None:
    await access.settle(grant, Outcome(Usage(prompt, completion), 200, provider="mock"))


async def spent_cost(redis: Redis, space: KeySpace, key_id: str, stamp: str) -> int:
    return int(await redis.get(space.spent_cost(key_id, stamp)) or 0)


async def test_reserves_the_worst_case_clips_max_tokens_then_refuses(
    access: RedisAccessControl, redis: Redis
) -> None:
    principal = await make_key(access, budget_cost=1.0)  # 1,000,000 millionths
    first = await access.admit(ticket(principal, 100, 500))  # would cost 1,100,000
    assert (first.max_tokens, first.reserved_cost) == (450, 100 * 1000 + 450 * 2000)
    with pytest.raises(QuotaExceeded) as err:
        await access.admit(ticket(principal, 1, 1))
    assert err.value.status == 429 and err.value.code == "cost_budget_exceeded"
    await settle(access, first, 100, 50)  # costs 200,000; the rest of the reservation returns
    space = access.store.space
    assert await spent_cost(redis, space, principal.key_id, "all") == 200_000
    second = await access.admit(ticket(principal, 100, 500))
    assert (second.max_tokens, second.reserved_cost) == (350, 800_000)
    with pytest.raises(QuotaExceeded):
        await access.admit(ticket(principal, 0, 1))


async def test_the_dearest_route_prices_the_reservation(access: RedisAccessControl) -> None:
    principal = await make_key(access, budget_cost=10.0)
    routes = (("mock", "y"), ("dear", "x"))  # the model's price, then a dearer route
    grant = await access.admit(ticket(principal, 10, 100, routes))
    assert grant.reserved_cost == 10 * 3000 + 100 * 4000  # cached input is the dearer input


async def test_the_charge_never_exceeds_the_reservation_or_the_budget(
    access: RedisAccessControl, redis: Redis
) -> None:
    principal = await make_key(access, budget_cost=0.5)
    grant = await access.admit(ticket(principal, 10, 90))
    assert grant.reserved_cost == 10 * 1000 + 90 * 2000
    await settle(access, grant, 4000, 90)  # the upstream counted far more prompt tokens
    assert await spent_cost(redis, access.store.space, principal.key_id, "all") == 190_000


async def test_a_daily_cost_budget_resets_the_next_utc_day(
    access: RedisAccessControl, redis: Redis, clock: Clock
) -> None:
    principal = await make_key(access, budget_cost=0.1, budget_cost_period="day")
    await settle(access, await access.admit(ticket(principal, 50, 25)), 50, 25)
    space = access.store.space
    assert await spent_cost(redis, space, principal.key_id, "2026-11-29") == 100_000
    assert await redis.pttl(space.spent_cost(principal.key_id, "2026-11-29")) > 0
    with pytest.raises(QuotaExceeded):
        await access.admit(ticket(principal, 1, 1))
    clock.now += 86_400
    assert (await access.admit(ticket(principal, 50, 25))).max_tokens == 25


async def test_a_lapsed_reservation_gives_its_cost_back(
    access: RedisAccessControl, clock: Clock
) -> None:
    principal = await make_key(access, budget_cost=0.1)
    held = await access.admit(ticket(principal, 50, 25))  # holds the whole budget
    with pytest.raises(QuotaExceeded):
        await access.admit(ticket(principal, 1, 1))
    access.keeper.drop(held.token)  # its replica is gone: nobody renews the lease
    clock.now += 301
    assert (await access.admit(ticket(principal, 50, 25))).reserved_cost == 100_000


async def test_token_and_cost_budgets_both_clip(access: RedisAccessControl) -> None:
    principal = await make_key(access, budget_tokens=300, budget_cost=1.0)
    grant = await access.admit(ticket(principal, 100, 1000))
    assert grant.max_tokens == 200  # the token budget is the tighter
    assert grant.reserved_cost == 100 * 1000 + 200 * 2000


# Through the HTTP API. The gateway estimates the message below at 15 prompt tokens (see
# tests/gateway/keys/test_access_e2e.py); the mock counts 6 and answers one token per word.
USER = [{"role": "user", "content": "alpha beta gamma delta epsilon"}]
ESTIMATE = 15
MODELS = {"priced-model": {"routes": [{"provider": "mock", "model": "echo"}]}}
USAGE = {"enabled": False, "prices": {"priced-model": {"input": 1000.0, "output": 2000.0}}}


async def test_http_max_tokens_is_cut_to_the_cost_left_then_429(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    budget = (ESTIMATE * 1000 + 3 * 2000) / 1e6  # the prompt and three output tokens
    key = {"budget_cost": budget}
    async with configured_gateway(
        mock_upstream, redis_prefix, models=MODELS, usage=USAGE, key=key
    ) as gw:
        client = gw.async_client()
        resp = await client.chat.completions.create(
            model="priced-model", messages=USER, max_tokens=100
        )
        assert mock_upstream.requests[-1].body["max_tokens"] == 3
        assert resp.choices[0].finish_reason == "length"
        await gw.settled()
        with pytest.raises(openai.RateLimitError) as err:
            await client.chat.completions.create(model="priced-model", messages=USER)
        assert err.value.status_code == 429
        assert err.value.code == "cost_budget_exceeded"
        assert err.value.type == "insufficient_quota"


async def test_http_concurrent_requests_never_overshoot_the_cost_budget(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    budget_micros = 10 * (ESTIMATE * 1000 + 5 * 2000)  # ten worst cases of max_tokens=5
    key = {"budget_cost": budget_micros / 1e6}
    async with configured_gateway(
        mock_upstream, redis_prefix, models=MODELS, usage=USAGE, key=key
    ) as gw:
        client = gw.async_client()

        async def one() -> str:
            try:
                await client.chat.completions.create(
                    model="priced-model", messages=USER, max_tokens=5
                )
            except openai.RateLimitError as exc:
                return str(exc.code)
            return "ok"

        results = await asyncio.gather(*(one() for _ in range(60)))
        assert set(results) == {"ok", "cost_budget_exceeded"}
        await gw.settled()
        for _ in range(20):  # then one at a time, until what is left fits no request
            results.append(await one())
            await gw.settled()
            if results[-1] != "ok":
                break
        served = results.count("ok")
        redis = Redis.from_url(REDIS_URL)
        try:
            (record,) = await KeyStore(redis, prefix=redis_prefix).list()
            spent_key = KeySpace(redis_prefix).spent_cost(record.id, "all")
            spent = int(await redis.get(spent_key) or 0)
        finally:
            await redis.aclose()
        # Each served request costs 6 prompt tokens at the mock's count and one output token
        # per word, up to the max_tokens it was sent (5, or fewer when the cost left clipped it).
        sent = [r.body["max_tokens"] for r in mock_upstream.requests]
        assert len(sent) == served
        assert spent == sum(6 * 1000 + min(5, m) * 2000 for m in sent) <= budget_micros
        assert results[-1] == "cost_budget_exceeded"
        assert budget_micros - spent < ESTIMATE * 1000 + 2000  # the prompt and one token
