"""Settlement's side of the usage store: the stream is capped at `usage_stream_maxlen`
without a store and left for the store's consumer to trim with one (0), and each record
carries its cost, priced by route, local engine or model."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.access.contract import Outcome, Ticket
from gateway.config.usage import UsageSettings
from gateway.keys.records import KeyCreate
from gateway.keys.redis_access import RedisAccessControl
from gateway.keys.store import text
from gateway.usage_store.pricing import Pricing
from providers.types import Usage

PRICES = UsageSettings(
    prices={"chat": {"input": 1.0, "cached_input": 0.1, "output": 4.0}},
    route_prices={"cheap/echo": {"input": 0.5, "output": 1.0}},
    local_price={"input": 0.01, "output": 0.02},
)


@pytest.mark.parametrize(("maxlen", "kept"), [(3, 3), (0, 5)])
async def test_the_stream_is_capped_only_without_a_store(
    redis: Redis, tmp_path: Path, maxlen: int, kept: int
) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    pricing = Pricing(PRICES, frozenset({"engine"}))
    access = RedisAccessControl(
        redis,
        prefix=prefix,
        usage_stream_maxlen=maxlen,
        spool_dir=tmp_path / "spool",
        pricing=pricing,
    )
    try:
        secret, _ = await access.store.create(KeyCreate(name="t"))
        principal = await access.authenticate(secret)
        routes = [("mock", "x"), ("cheap", "echo"), ("engine", "local"), ("mock", "x"), ("m", "y")]
        for provider, route_model in routes:
            grant = await access.admit(Ticket(principal, "chat", f"r-{uuid.uuid4().hex}", 10, 20))
            usage = Usage(1000, 500, cached_prompt_tokens=400)
            await access.settle(
                grant, Outcome(usage, 200, provider=provider, route_model=route_model)
            )
        entries = await redis.xrange(access.store.space.usage_log())
        assert len(entries) == kept
        costs = [float(text(fields[b"cost"])) for _, fields in entries]
        expected = [
            (600 * 1.0 + 400 * 0.1 + 500 * 4.0) / 1e6,  # the model's price
            (1000 * 0.5 + 500 * 1.0) / 1e6,  # the route's (no cached price: input's)
            (1000 * 0.01 + 500 * 0.02) / 1e6,  # the local engine's
            (600 * 1.0 + 400 * 0.1 + 500 * 4.0) / 1e6,
            (600 * 1.0 + 400 * 0.1 + 500 * 4.0) / 1e6,
        ][-kept:]
        assert costs == pytest.approx(expected)
    finally:
        await access.aclose()
        keys = [key async for key in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)


def test_pricing_is_free_only_with_no_price_set_anywhere() -> None:
    """A free pricing is not consulted at settlement (the gateway passes none): only when
    every request would cost 0."""
    assert Pricing(UsageSettings(), frozenset({"engine"})).free
    assert not Pricing(PRICES, frozenset()).free
    for one in (
        UsageSettings(prices={"chat": {"output": 0.5}}),
        UsageSettings(route_prices={"a/b": {}}),  # named, even at 0: a price is set
        UsageSettings(local_price={"cached_input": 0.1}),
    ):
        assert not Pricing(one, frozenset()).free
    free = Pricing(UsageSettings(), frozenset())
    assert free.cost("chat", "mock", "x", 1000, 400, 500) == 0
    assert free.worst("chat", (("mock", "x"),)) == (0.0, 0.0)
