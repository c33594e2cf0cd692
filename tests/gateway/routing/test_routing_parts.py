"""The routing parts on plain data: the breaker's state machine, settings validation, and the
conversation hash."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config.routing import BreakerSettings, RoutingSettings
from gateway.config.settings import Settings
from gateway.routing.breaker import ALLOW, BACKOFF, OPEN, Breaker, Breakers, counts_as_failure
from gateway.routing.judge import Judge
from gateway.routing.sticky import conversation_id
from providers import errors as perr
from providers.types import ChatRequest, Message
from providers.upstream.errors import http_error


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_open_then_one_probe_closes() -> None:
    clock = Clock()
    breaker = Breaker(BreakerSettings(failures=3, cooldown_s=10), clock)
    for _ in range(2):
        breaker.failure("upstream_unavailable")
    assert breaker.state == "closed" and breaker.allow()
    assert breaker.failure("upstream_unavailable (HTTP 500): down")
    assert breaker.state == "open" and not breaker.allow()
    assert breaker.probe_in_s() == 10
    clock.now += 10
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    assert breaker.state == "half_open"
    assert not breaker.failure("still down")  # the probe failed: another cooldown
    assert breaker.state == "open" and breaker.times_opened == 1
    assert breaker.last_error == "still down"
    clock.now += 10
    assert breaker.allow()
    assert breaker.success()
    assert breaker.state == "closed" and breaker.allow() and breaker.allow()


def test_an_error_rate_opens_without_consecutive_failures() -> None:
    breaker = Breaker(BreakerSettings(failures=100, error_rate=0.5, window=4), Clock())
    breaker.failure("x")
    breaker.success()
    breaker.success()
    assert breaker.state == "closed"  # the window is not full yet
    breaker.failure("x")
    assert breaker.state == "open"  # 2 of the last 4 failed


def test_a_released_probe_may_be_sent_again() -> None:
    clock = Clock()
    breaker = Breaker(BreakerSettings(failures=1, cooldown_s=5), clock)
    breaker.failure("x")
    clock.now += 5
    assert breaker.allow() and not breaker.allow()
    breaker.release()  # the probe's client left: no verdict
    assert breaker.allow()


def test_breakers_are_per_route_key_and_429_is_a_back_off() -> None:
    clock = Clock()
    breakers = Breakers(BreakerSettings(failures=1, cooldown_s=5), clock)
    failing, healthy = ("p", "bad-model", ""), ("p", "good-model", "")
    breakers.failure(failing, "upstream_unavailable")
    assert breakers.check(failing) == OPEN and breakers.check(healthy) == ALLOW
    assert breakers.is_failing("p", "bad-model") and not breakers.is_failing("p", "good-model")
    limited = ("p", "busy-model", "")
    for _ in range(10):
        breakers.rate_limited(limited, 7, "upstream_rate_limited")
    assert breakers.check(limited) == BACKOFF and not breakers.is_failing("p", "busy-model")
    assert breakers.wait_s([limited]) == 7
    clock.now += 7
    assert breakers.check(limited) == ALLOW
    breakers.rate_limited(limited, None, "x")  # no Retry-After: the default back-off
    assert breakers.wait_s([limited]) == BreakerSettings().rate_limit_backoff_s
    breakers.rate_limited(limited, 10**6, "x")
    assert breakers.wait_s([limited]) == BreakerSettings().max_backoff_s


def test_a_provider_of_several_accounts_fails_only_when_every_account_does() -> None:
    breakers = Breakers(BreakerSettings(failures=1), Clock())
    breakers.accounts["p"] = ("KEY_A", "KEY_B")
    breakers.failure(("p", "m", "KEY_A"), "upstream_auth_failed")
    assert breakers.check(("p", "m", "KEY_A")) == OPEN
    assert breakers.check(("p", "m", "KEY_B")) == ALLOW
    assert not breakers.is_failing("p", "m")
    breakers.failure(("p", "m", "KEY_B"), "upstream_auth_failed")
    assert breakers.is_failing("p", "m")


def test_the_number_of_breakers_is_bounded_and_open_ones_are_kept() -> None:
    breakers = Breakers(BreakerSettings(failures=2, max_tracked=3), Clock())
    breakers.failure(("p", "open", ""), "x")
    breakers.failure(("p", "open", ""), "x")
    for i in range(10):
        breakers.failure(("p", f"m{i}", ""), "x")
    kept = [key for key, _ in breakers.items()]
    assert len(kept) == 3 and ("p", "open", "") in kept


def test_what_counts_as_a_failure_of_the_upstream() -> None:
    counted = [
        http_error("p", 500, "", None),
        http_error("p", 503, "", "7"),
        http_error("p", 504, "", None),
        http_error("p", 401, "", None),
        perr.UpstreamTimeout("first byte"),
        perr.UpstreamUnavailable("refused"),
    ]
    ignored = [
        http_error("p", 429, "", "7"),
        http_error("p", 429, "", None),
        http_error("p", 400, "", None),
        http_error("p", 404, "", None),
        http_error("p", 413, "", None),
        http_error("p", 422, "", None),
        perr.Overloaded("queue full"),
        perr.InvalidRequest("too long"),
    ]
    assert all(counts_as_failure(e) for e in counted)
    assert not any(counts_as_failure(e) for e in ignored)


def test_bad_routing_settings_are_refused_at_load() -> None:
    with pytest.raises(ValidationError, match="not a regular expression"):
        Settings(routing={"rules": [{"name": "x", "thinking": "on", "pattern": "("}]})
    with pytest.raises(ValidationError):
        Settings(routing={"rules": [{"name": "Bad Name", "thinking": "on"}]})
    with pytest.raises(ValidationError):
        Settings(routing={"rules": [{"name": "x", "thinking": "on", "turns": ["sideways"]}]})
    with pytest.raises(ValueError, match="not a readable model"):
        Judge(RoutingSettings(scorer={"weights_file": __file__}))


def test_a_conversation_is_named_by_its_first_messages() -> None:
    first = (Message("system", "terse"), Message("user", "hello"))
    later = (*first, Message("assistant", "hi"), Message("user", "more"))
    a = conversation_id("k", "m", ChatRequest("m", first))
    assert a == conversation_id("k", "m", ChatRequest("m", later))
    assert a != conversation_id("k2", "m", ChatRequest("m", first))
    assert a != conversation_id("k", "m", ChatRequest("m", (Message("user", "hello"),)))
    assert conversation_id("k", "m", ChatRequest("m", (), prompt="text")) is None
