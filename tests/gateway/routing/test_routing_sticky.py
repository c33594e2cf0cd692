"""Conversation stickiness off the request's critical path: a first turn's write runs in the
background (the decision does not wait for it, shutdown does), and a follow-up's read starts
before the prompt is prepared. Redis here is a stand-in whose replies wait for a gate."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from structlog.testing import capture_logs

from gateway.access.contract import Principal
from gateway.config.providers import ModelSettings
from gateway.config.routing import RoutingSettings
from gateway.observability.metrics import Metrics
from gateway.routing.aliases import Route, Router
from gateway.routing.ask import Ask, ask_of
from gateway.routing.decide import Decider, RoutingInput
from gateway.routing.judge import Judge, Verdict
from gateway.routing.plan import RoutePlanner
from gateway.routing.policy import KeyPolicy
from gateway.routing.sticky import Stickiness, conversation_id
from providers.types import ChatRequest, Message, PreparedPrompt

HARD = "Prove that there are infinitely many primes."
FIRST = (Message("user", HARD),)
FOLLOW_UP = (*FIRST, Message("assistant", "Suppose not."), Message("user", "Thanks, go on."))


@dataclass
class GatedRedis:
    """GET, and pipelined SET, on a dict; each reply waits until `gate` is set."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    store: dict[str, bytes] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    async def get(self, key: str) -> bytes | None:
        self.calls.append("get")
        await self.gate.wait()
        return self.store.get(key)

    def pipeline(self, transaction: bool) -> Pipeline:
        return Pipeline(self)


@dataclass
class Pipeline:
    redis: GatedRedis
    sets: list[tuple[str, str]] = field(default_factory=list)

    async def __aenter__(self) -> Pipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def set(self, key: str, value: str, ex: int) -> None:
        self.sets.append((key, value))

    async def execute(self) -> None:
        self.redis.calls.append(f"set x{len(self.sets)}")
        await self.redis.gate.wait()
        for key, value in self.sets:
            self.redis.store[key] = value.encode()


@dataclass
class Upstream:
    name: str = "up"


ROUTES = (Route(Upstream(), "m", None),)  # type: ignore[arg-type]


def sticky(redis: GatedRedis) -> Stickiness:
    return Stickiness(redis, "p:", 60)  # type: ignore[arg-type]


async def test_a_first_turn_is_decided_without_waiting_for_its_write() -> None:
    redis = GatedRedis()
    stickiness = sticky(redis)
    decider = Decider(RoutingSettings(), frozenset(), {}, stickiness)
    chat = ChatRequest(model="m", messages=FIRST)
    inp = RoutingInput(chat, "chat", "m", ROUTES, "auto", KeyPolicy(), "k", 10)
    decision = await asyncio.wait_for(decider.decide(inp), 10)  # no Redis reply can arrive
    assert (decision.thinking, decision.reason) == (True, "rule:proof-request@2")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert redis.calls == ["set x1"] and not redis.store  # sent, not yet answered
    redis.gate.set()
    await stickiness.drain()
    conversation = conversation_id("k", "m", chat)
    assert redis.store == {f"p:route:conv:{conversation}": b"on"}
    # a turn that continues the work reads it back (and writes nothing)
    next_turn = ChatRequest(model="m", messages=FOLLOW_UP)
    follow_up = RoutingInput(next_turn, "chat", "m", ROUTES, "auto", KeyPolicy(), "k", 10)
    assert (await decider.decide(follow_up)).reason == "sticky"
    assert redis.calls == ["set x1", "get"]


@dataclass
class Preparer:
    """A provider that prepares prompts; it notes what Redis had been asked by then."""

    redis: GatedRedis
    name: str = "local"
    seen: list[str] = field(default_factory=list)

    async def prepare(self, request: ChatRequest) -> PreparedPrompt:
        await asyncio.sleep(0)  # the tokenizer's thread, as far as the loop can tell
        self.seen = list(self.redis.calls)
        self.redis.gate.set()
        return PreparedPrompt(self.name, [1, 2, 3], False, True, False, False)

    async def chat(self, request: ChatRequest) -> Any:
        raise AssertionError("not served here")


async def test_a_follow_up_reads_its_mode_while_the_prompt_is_prepared() -> None:
    redis = GatedRedis()
    conversation = conversation_id("k", "m", ChatRequest(model="m", messages=FOLLOW_UP))
    redis.store[f"p:route:conv:{conversation}"] = b"off"
    provider = Preparer(redis)
    model = ModelSettings(routing="auto", routes=[{"provider": "local", "model": "x"}])
    router = Router({"local": provider}, {"m": model})  # type: ignore[dict-item]
    stickiness = sticky(redis)
    decider = Decider(RoutingSettings(), frozenset({"local"}), {}, stickiness)
    planner = RoutePlanner(router, decider, Metrics())
    principal = Principal("k", "test")
    _, chat, decision = await planner.plan(
        principal, ChatRequest(model="m", messages=FOLLOW_UP), "chat"
    )
    assert provider.seen == ["get"]  # asked before the prompt was ready
    assert chat.prepared is not None
    assert (decision.thinking, decision.reason) == (False, "sticky")
    # a first turn has nothing to read: the planner starts no read
    redis.calls.clear()
    await planner.plan(principal, ChatRequest(model="m", messages=FIRST), "chat")
    await stickiness.drain()
    assert provider.seen == [] and redis.calls == ["set x1"]


@dataclass
class AskingPreparer(Preparer):
    """A provider that prepares prompts in a worker thread, and runs what the router reads
    alongside there (as LocalProvider.prepare_with does)."""

    threads: list[int] = field(default_factory=list)

    async def prepare_with(self, request: ChatRequest, also: Any) -> tuple[PreparedPrompt, Any]:
        def both() -> tuple[PreparedPrompt, Any]:
            self.threads.append(threading.get_ident())
            return PreparedPrompt(self.name, [1, 2, 3], False, True, False, False), also(request)

        return await asyncio.to_thread(both)


class AskNotingJudge(Judge):
    def __init__(self) -> None:
        super().__init__(RoutingSettings())
        self.asks: list[Ask | None] = []

    def judge(self, *args: Any, **kwargs: Any) -> Verdict:
        self.asks.append(kwargs.get("ask", args[4] if len(args) > 4 else None))
        return super().judge(*args, **kwargs)


async def test_the_judges_ask_is_read_off_the_loop_with_the_prompt() -> None:
    """Where a route prepares the prompt in a worker thread and the judge will decide, the ask
    is read there too, and the judge takes it as read; a model that does not judge reads none."""
    redis = GatedRedis()
    redis.gate.set()
    provider = AskingPreparer(redis)
    models = {
        "m": ModelSettings(routing="auto", routes=[{"provider": "local", "model": "x"}]),
        "fixed": ModelSettings(routes=[{"provider": "local", "model": "x"}]),
    }
    router = Router({"local": provider}, models)  # type: ignore[dict-item]
    decider = Decider(RoutingSettings(), frozenset({"local"}), {}, sticky(redis))
    judge = decider.judge = AskNotingJudge()
    planner = RoutePlanner(router, decider, Metrics())
    principal = Principal("k", "test")
    chat = ChatRequest(model="m", messages=FIRST)
    _, prepared, decision = await planner.plan(principal, chat, "chat")
    assert prepared.prepared is not None
    assert provider.threads and provider.threads[-1] != threading.get_ident()
    assert judge.asks == [ask_of(chat)]
    assert (decision.thinking, decision.reason) == (True, "rule:proof-request@2")
    provider.threads.clear()
    await planner.plan(principal, ChatRequest(model="fixed", messages=FIRST), "chat")
    assert provider.threads == [] and judge.asks == [ask_of(chat)]  # prepared, not judged


async def test_writes_of_one_loop_iteration_share_a_round_trip_and_failures_are_dropped() -> None:
    redis = GatedRedis()
    redis.gate.set()
    stickiness = sticky(redis)
    stickiness.remember("c1", True)
    stickiness.remember("c2", False)
    stickiness.remember("c1", False)  # the latest turn decided anew wins
    await stickiness.drain()
    assert redis.calls == ["set x2"]
    assert redis.store == {"p:route:conv:c1": b"off", "p:route:conv:c2": b"off"}

    class Down(GatedRedis):
        def pipeline(self, transaction: bool) -> Pipeline:
            raise RedisConnectionError("Redis is away")

    failing = sticky(Down())
    with capture_logs() as logs:
        failing.remember("c3", True)
        await failing.drain()
    assert [e["event"] for e in logs] == ["sticky_write_failed"]
