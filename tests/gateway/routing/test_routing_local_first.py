"""The local-or-upstream choice of auto models on its own: queue allowance, the cached prefix
that buys a longer queue, the context limit, a cluster peer's queue, and what the header notes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gateway.config.routing import RoutingSettings
from gateway.routing.aliases import Route
from gateway.routing.decide import Decider, RoutingInput
from gateway.routing.local_first import LocalFirst
from gateway.routing.policy import KeyPolicy
from providers.types import ChatRequest, EngineFit, Message, PreparedPrompt, ProviderLoad

# one request over the allowance needs 100 cached tokens; at most 3 may wait
SETTINGS = RoutingSettings(local_max_queue=1, prefix={"wait_cost_tokens": 100, "max_queue": 3})


@dataclass
class Engine:
    """A local provider's view for the router: `queue` waiting, `cached` tokens of the prompt."""

    name: str = "local"
    queue: int = 0
    cached: int = 0
    peer: str | None = None
    peer_waiting: int = 0
    asked: list[PreparedPrompt] = field(default_factory=list)

    def load(self) -> ProviderLoad:
        return ProviderLoad(waiting=self.queue, running=1, slots=1, max_context=1000)

    def fit(self, prompt: PreparedPrompt) -> EngineFit:
        self.asked.append(prompt)
        return EngineFit(self.cached, self.peer, self.peer_waiting)


@dataclass
class Upstream:
    name: str = "up"


def prompt(owner: str = "local", tokens: int = 500) -> PreparedPrompt:
    return PreparedPrompt(owner, list(range(tokens)), False, True, False, False, (b"h",))


def routes(engine: Engine) -> tuple[Route, ...]:
    return (Route(engine, "m", None), Route(Upstream(), "m", None))  # type: ignore[arg-type]


def order(engine: Engine, tokens: int = 500, owner: str = "local") -> tuple[str, str, tuple]:
    """(the choice, the provider tried first, the header notes)."""
    first = LocalFirst(SETTINGS, frozenset({"local"}), {"local": engine, "up": Upstream()})
    result = first.order(routes(engine), tokens, prompt(owner, tokens))
    return result.choice, result.routes[0].provider_name, result.notes()


def test_a_short_queue_keeps_the_local_engine_and_reports_its_cache() -> None:
    # queue_after = running 1 + waiting 0 + 1 - slots 1 = 1: at the allowance
    assert order(Engine(queue=0, cached=32)) == ("local", "local", ("cached=32",))


@pytest.mark.parametrize(
    ("queue", "cached", "expected"),
    [
        (1, 0, ("queue", "up", ("cached=0", "overflow=queue"))),  # cold: overflows
        (1, 99, ("queue", "up", ("cached=99", "overflow=queue"))),  # saves less than the wait
        (1, 100, ("prefix", "local", ("cached=100", "kept=prefix"))),  # one over: 100 tokens
        (2, 199, ("queue", "up", ("cached=199", "overflow=queue"))),  # two over: 200 needed
        (2, 200, ("prefix", "local", ("cached=200", "kept=prefix"))),
        (3, 10_000, ("queue", "up", ("cached=10000", "overflow=queue"))),  # past max_queue
    ],
)
def test_a_cached_prefix_buys_a_longer_queue(
    queue: int, cached: int, expected: tuple[str, str, tuple]
) -> None:
    assert order(Engine(queue=queue, cached=cached)) == expected


def test_a_prompt_over_the_context_overflows_without_a_lookup() -> None:
    engine = Engine(cached=5000)
    assert order(engine, tokens=1000) == ("context", "up", ("overflow=context",))
    assert engine.asked == []


def test_a_cluster_peer_is_judged_by_its_own_queue() -> None:
    # this node is far over its allowance, but the placer would forward to an idle peer
    assert order(Engine(queue=9, peer="b", peer_waiting=0)) == ("local", "local", ("cached=0",))
    # a peer with 2 waiting: this request makes 3, two over the allowance of 1
    busy_peer = Engine(queue=0, cached=150, peer="b", peer_waiting=2)
    assert order(busy_peer)[0] == "queue"
    assert order(Engine(queue=0, cached=200, peer="b", peer_waiting=2))[0] == "prefix"


def test_a_prompt_prepared_by_another_provider_is_not_looked_up() -> None:
    engine = Engine(queue=1, cached=5000)
    assert order(engine, owner="other") == ("queue", "up", ("overflow=queue",))
    assert engine.asked == []


async def test_a_local_only_key_never_overflows_however_cold_its_prompt() -> None:
    engine = Engine(queue=50, cached=0)
    decider = Decider(SETTINGS, frozenset({"local"}), {"local": engine, "up": Upstream()}, None)
    chat = ChatRequest(model="m", messages=(Message("user", "hi"),), prepared=prompt())

    async def decide(policy: KeyPolicy) -> tuple[list[str], tuple[str, ...], str]:
        inp = RoutingInput(chat, "chat", "m", routes(engine), "auto", policy, "k", 500)
        decision = await decider.decide(inp)
        return [r.provider_name for r in decision.routes], decision.notes, decision.load

    assert await decide(KeyPolicy(providers="local")) == (["local"], (), "none")
    assert await decide(KeyPolicy()) == (
        ["up", "local"],
        ("cached=0", "overflow=queue"),
        "queue",
    )


def test_a_local_provider_not_ready_leaves_the_routes_as_they_are() -> None:
    class NotReady(Engine):
        def load(self) -> ProviderLoad | None:  # type: ignore[override]
            return None  # a serving worker whose engine in worker 0 has not answered yet

    engine = NotReady(queue=50)
    assert order(engine) == ("none", "local", ())
    assert engine.asked == []
