"""`[server] workers = 2` with the local engine: worker 1 (no model) serves every protocol exactly
as worker 0 (the engine) does, through worker 0's engine socket. Both workers are apps in this
process on ports of their own (tests/support/worker_pair.py), on the scripted tiny checkpoint (its
greedy answer after `</think>` is a tool call), on the real Redis."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from backend.engine.interface import EngineStats
from backend.engine.sampling_params import SamplingParams
from providers.local.remote_engine import GENERATE_PATH
from providers.local.worker_engine import ENGINE_PATH, EngineInfo, SharedEngine
from tests.support.local_engine import WEATHER_TOOL
from tests.support.local_gateway import TOOL_ARGUMENTS, TOOL_NAME
from tests.support.worker_pair import WorkerPair, open_worker_pair, ready, until

pytestmark = pytest.mark.asyncio(loop_scope="module")

WEATHER_SCHEMA = WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
# Two full blocks (block_size 16) and more: a repeat of the prompt reads them from the cache.
SEA = "Tell me about the sea, the waves, the tides, the boats and the gulls over the harbour."
USER = [{"role": "user", "content": SEA}]
# Fields that differ between any two answers (ids, clocks) and the prefix-cache counts (the
# second of two identical prompts is served from the cache: checked on their own).
VOLATILE = {"id", "created", "created_at", "call_id", "item_id", "system_fingerprint"}
CACHE = {
    "cached_tokens",
    "prompt_cache_hit_tokens",
    "prompt_cache_miss_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(scripted_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    async with open_worker_pair(scripted_checkpoint, tmp_path_factory.mktemp("pair")) as pair:
        yield pair


def normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: "<volatile>" if k in VOLATILE or k in CACHE else normalized(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [normalized(v) for v in value]
    return value


def parsed(raw: bytes, content_type: str) -> Any:
    """A JSON body, or an SSE body as its (event, data) frames (keep-alive comments dropped)."""
    if not content_type.startswith("text/event-stream"):
        return json.loads(raw)
    frames = []
    for frame in raw.decode().split("\n\n"):
        lines = [ln for ln in frame.split("\n") if ln and not ln.startswith(":")]
        if not lines:
            continue
        fields = dict(ln.split(": ", 1) for ln in lines)
        data = fields.get("data", "")
        frames.append((fields.get("event"), data if data == "[DONE]" else json.loads(data)))
    return frames


async def ask(root: str, key: str, path: str, body: dict[str, Any]) -> tuple[int, str, Any]:
    """(status, x-gateway-route, parsed body) of one request."""
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(root + path, json=body, headers=headers) as resp,
    ):
        raw = await resp.read()
        return resp.status, resp.headers.get("x-gateway-route", ""), parsed(raw, resp.content_type)


CASES: list[tuple[str, str, dict[str, Any]]] = [
    (
        "chat json, a tool call",
        "/v1/chat/completions",
        {"model": "deepseek-chat", "messages": USER, "tools": [WEATHER_TOOL], "max_tokens": 40},
    ),
    (
        "chat stream with usage",
        "/v1/chat/completions",
        {
            "model": "deepseek-chat",
            "messages": USER,
            "tools": [WEATHER_TOOL],
            "max_tokens": 40,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    (
        "chat json, thinking with the key's reasoning budget",
        "/v1/chat/completions",
        {"model": "deepseek-reasoner", "messages": USER, "max_tokens": 12, "temperature": 0},
    ),
    (
        "completions json",
        "/v1/completions",
        {"model": "deepseek-chat", "prompt": SEA, "max_tokens": 6, "temperature": 0},
    ),
    (
        "completions stream",
        "/v1/completions",
        {"model": "deepseek-chat", "prompt": SEA, "max_tokens": 6, "stream": True},
    ),
    (
        "fill in the middle, DeepSeek's beta path, stream",
        "/beta/completions",
        {
            "model": "deepseek-chat",
            "prompt": "def sea(waves):\n    ",
            "suffix": "\n\nprint(sea(3))\n",
            "max_tokens": 6,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    (
        "responses json, a tool call",
        "/v1/responses",
        {
            "model": "deepseek-chat",
            "input": SEA,
            "tools": [{"type": "function", "name": TOOL_NAME, "parameters": WEATHER_SCHEMA}],
            "max_output_tokens": 40,
        },
    ),
    (
        "responses stream",
        "/v1/responses",
        {"model": "deepseek-chat", "input": SEA, "max_output_tokens": 8, "stream": True},
    ),
    (
        "messages json, a tool use",
        "/v1/messages",
        {
            "model": "deepseek-chat",
            "messages": USER,
            "tools": [{"name": TOOL_NAME, "input_schema": WEATHER_SCHEMA}],
            "max_tokens": 40,
        },
    ),
    (
        "messages stream, thinking with budget_tokens",
        "/v1/messages",
        {
            "model": "deepseek-v3.1",
            "messages": USER,
            "max_tokens": 10,
            "thinking": {"type": "enabled", "budget_tokens": 3},
            "stream": True,
        },
    ),
]


@pytest.mark.parametrize(("case", "path", "body"), CASES, ids=[c[0] for c in CASES])
async def test_worker_1_answers_as_worker_0_does(
    pair: WorkerPair, case: str, path: str, body: dict[str, Any]
) -> None:
    key = await pair.key(max_reasoning_tokens=4)
    body = {**body, "temperature": 0}  # greedy: both workers' answers are the same tokens
    status0, route0, answer0 = await ask(pair.roots[0], key, path, body)
    status1, route1, answer1 = await ask(pair.roots[1], key, path, body)
    assert status0 == status1 == 200, (answer0, answer1)
    assert route1 == route0 and "provider=local" in route1
    assert normalized(answer1) == normalized(answer0)


async def test_tool_calls_usage_cache_and_budget_on_worker_1(pair: WorkerPair) -> None:
    key = await pair.key(max_reasoning_tokens=4)
    body = {"model": "deepseek-chat", "messages": USER, "tools": [WEATHER_TOOL], "max_tokens": 40}
    await ask(pair.roots[0], key, "/v1/chat/completions", body)  # the prompt is cached now
    status, _, answer = await ask(pair.roots[1], key, "/v1/chat/completions", body)
    assert status == 200
    call = answer["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == (TOOL_NAME, json.loads(TOOL_ARGUMENTS))
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    usage = answer["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 32  # worker 0's blocks, reused
    # greedy: a sampled answer may close its reasoning before the budget does
    thinking = {"model": "deepseek-reasoner", "messages": USER, "max_tokens": 12, "temperature": 0}
    status, _, answer = await ask(pair.roots[1], key, "/v1/chat/completions", thinking)
    assert status == 200
    assert answer["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4


async def engine_idle(pair: WorkerPair) -> bool:
    stats = pair.engine_provider.engine_stats()
    return stats.num_running == stats.num_waiting == 0 and (
        stats.num_free_blocks == stats.num_total_blocks
    )


async def test_a_client_leaving_worker_1_frees_the_engines_blocks(pair: WorkerPair) -> None:
    await until(lambda: engine_idle(pair))
    key = await pair.key()
    body = {"model": "deepseek-v3.1", "messages": USER, "max_tokens": 1500, "stream": True}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        resp = await session.post(pair.roots[1] + "/v1/chat/completions", json=body)
        assert resp.status == 200
        await resp.content.readline()

        async def running() -> bool:
            return pair.engine_provider.engine_stats().num_running == 1

        await until(running)

        # worker 1's routing sees the engine's load from its poll
        async def seen() -> bool:
            load = pair.shared_provider.load()
            return load is not None and load.running == 1

        await until(seen)
        resp.close()  # drop the connection mid-stream
    await until(lambda: engine_idle(pair))


async def test_load_counts_requests_sent_since_the_last_poll() -> None:
    stats = EngineStats(2, 3, 10, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0)
    info = EngineInfo(Path("/ckpt"), "m", 2048, 8, True, stats, 16, b"seed")
    async with aiohttp.ClientSession() as session:
        engine = SharedEngine(session, "secret", info)
        assert engine.stats().num_waiting == 2 and engine.is_running
        outputs = engine.generate("r1", [1, 2, 3], SamplingParams())
        assert engine.stats().num_waiting == 3  # sent, not yet in any poll
        sent = engine.sent
        engine.update(info, sent_before=sent)  # a poll asked for after it counts it
        assert engine.stats().num_waiting == 2
        engine.lost()
        assert not engine.is_running
        await outputs.aclose()


async def test_worker_1_is_not_ready_until_the_engine_answers(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    async with open_worker_pair(tiny_checkpoint, tmp_path, start_engine_first=False) as pair:
        root = pair.roots[1]
        async with aiohttp.ClientSession() as session, session.get(f"{root}/readyz") as resp:
            assert resp.status == 503
            assert (await resp.json())["checks"]["engine:local"] is False
        key = await pair.key()
        body = {"model": "deepseek-chat", "messages": USER, "max_tokens": 4}
        status, _, answer = await ask(root, key, "/v1/chat/completions", body)
        assert status == 503 and answer["error"]["code"] == "engine_loading"
        status, _, answer = await ask(root, key, "/v1/messages", body)
        assert status == 529 and answer["error"]["type"] == "overloaded_error"
        await pair.start(0)
        await until(lambda: ready(root))
        status, _, answer = await ask(root, key, "/v1/chat/completions", body)
        assert status == 200 and answer["usage"]["completion_tokens"] == 4


async def test_the_engine_endpoints_are_closed_to_user_keys_and_on_tcp(pair: WorkerPair) -> None:
    key = await pair.key()
    async with aiohttp.ClientSession() as session:
        for root in pair.roots.values():
            for method, path in (("GET", ENGINE_PATH), ("POST", GENERATE_PATH)):
                async with session.request(
                    method, root + path, headers={"x-node-secret": pair_secret(pair)}
                ) as resp:
                    assert resp.status == 404  # the public port: not there at all
        sock = pair.settings.cluster.internal_socket
        assert sock is not None
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as unix:
            for headers in ({"Authorization": f"Bearer {key}"}, {"x-node-secret": "wrong"}):
                async with unix.get("http://localhost/internal/engine", headers=headers) as resp:
                    assert resp.status == 401
            async with unix.get(
                "http://localhost/internal/engine", headers={"x-node-secret": pair_secret(pair)}
            ) as resp:
                assert resp.status == 200
                info = EngineInfo.from_json(await resp.json())
    assert info.max_model_len == pair.engine_provider.context_length and info.running


def pair_secret(pair: WorkerPair) -> str:
    secret = pair.settings.cluster.secret
    assert secret is not None
    return secret.get_secret_value()


async def test_two_workers_share_one_engine_under_concurrency(pair: WorkerPair) -> None:
    key = await pair.key()

    async def one(i: int) -> tuple[int, Any]:
        body = {"model": "deepseek-v3.1", "messages": USER, "max_tokens": 5 + i % 3}
        status, _, answer = await ask(pair.roots[i % 2], key, "/v1/chat/completions", body)
        return status, answer

    results = await asyncio.gather(*(one(i) for i in range(16)))
    assert all(status == 200 for status, _ in results)
    assert [a["usage"]["completion_tokens"] for _, a in results] == [5 + i % 3 for i in range(16)]
    await until(lambda: engine_idle(pair))


async def test_the_engines_failure_reaches_the_other_workers() -> None:
    """Worker 0's engine down reason (the parallel ranks at fault) travels in its polls, so
    every worker's /readyz can say it."""
    stats = EngineStats(0, 0, 10, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0)
    failure = {
        "reason": "parallel engine down: rank 1 stopped responding",
        "ranks": {"1": "stopped responding"},
    }
    info = EngineInfo(Path("/ckpt"), "m", 2048, 8, False, stats, 16, b"seed", failure)
    polled = EngineInfo.from_json(json.loads(info.to_json()))
    assert polled == info
    running = EngineInfo.from_json(json.loads(replace(info, running=True, failure=None).to_json()))
    assert running.failure is None
    async with aiohttp.ClientSession() as session:
        assert SharedEngine(session, "secret", polled).failure == failure
    with pytest.raises(KeyError):
        EngineInfo.from_json({**json.loads(info.to_json()), "failure": {"reason": "x"}})
