"""The routing parts on plain data: the breaker's state machine, settings validation, and the
conversation hash."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config.routing import BreakerSettings, RoutingSettings
from gateway.config.settings import Settings
from gateway.routing.breaker import Breaker
from gateway.routing.judge import Judge
from gateway.routing.sticky import conversation_id
from providers.types import ChatRequest, Message


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_open_then_one_probe_closes() -> None:
    clock = Clock()
    breaker = Breaker(BreakerSettings(failures=3, cooldown_s=10), clock)
    for _ in range(2):
        breaker.failure()
    assert breaker.state == "closed" and breaker.allow()
    breaker.failure()
    assert breaker.state == "open" and not breaker.allow()
    assert breaker.retry_after_s() == 10
    clock.now += 10
    assert breaker.state == "half_open"
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.failure()  # the probe failed: another cooldown
    assert breaker.state == "open" and breaker.times_opened == 2
    clock.now += 10
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed" and breaker.allow() and breaker.allow()


def test_an_error_rate_opens_without_consecutive_failures() -> None:
    breaker = Breaker(BreakerSettings(failures=100, error_rate=0.5, window=4), Clock())
    breaker.failure()
    breaker.success()
    breaker.success()
    assert breaker.state == "closed"  # the window is not full yet
    breaker.failure()
    assert breaker.state == "open"  # 2 of the last 4 failed


def test_an_unanswered_probe_is_replaced_after_a_cooldown() -> None:
    clock = Clock()
    breaker = Breaker(BreakerSettings(failures=1, cooldown_s=5), clock)
    breaker.failure()
    clock.now += 5
    assert breaker.allow() and not breaker.allow()
    clock.now += 5
    assert breaker.allow()


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
