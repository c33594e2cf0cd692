"""End to end: two and three gateway node processes on 127.0.0.1 sharing a Redis, the openai SDK
as the client. A conversation reaching a node without its prefix is served by the node that has
it; a killed node, a restarted Redis and a stale index entry cost at most a recompute."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from backend.engine.block_hash import chain_hashes, root_hash
from backend.engine.blocks import BlockStored
from backend.engine.sampling_params import SamplingParams
from backend.model.fingerprint import checkpoint_fingerprint
from backend.text.tokenizer import Tokenizer
from gateway.cluster.keys import ClusterKeys, NodeRecord
from gateway.cluster.publisher import BlockEventBuffer, BlockPublisher
from gateway.config.cluster import ClusterSettings
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from providers.local.remote_engine import (
    GENERATE_PATH,
    SECRET_HEADER,
    PeerUnreachable,
    RemoteEngine,
    split_base,
)
from testkit.cluster_nodes import (
    SECRET,
    NodeProcess,
    cluster_status,
    free_port,
    node_sections,
    start_node,
    wait_cluster,
    wait_for,
    write_node_config,
)
from testkit.gateway_app import REDIS_URL, PrivateRedis

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16
TOPIC = (
    "You are a careful assistant for a lighthouse keeper. The keeper logs the weather, the "
    "ships that pass, the state of the lamp and the supplies in the store room every evening. "
    "Answer briefly and never invent ships that were not seen. "
)


def conversation(seed: str, turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": f"Log book {seed}. " + TOPIC * 2}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Entry {i} of log {seed}: what changed?"})
        if i < turns - 1:
            messages.append({"role": "assistant", "content": f"Nothing much on day {i}."})
    return messages


def next_turn(history: list[dict[str, str]], answer: str, question: str) -> list[dict[str, str]]:
    return [
        *history,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": question},
    ]


@dataclass
class Cluster:
    nodes: dict[str, NodeProcess]
    key: str
    prefix: str
    session: aiohttp.ClientSession

    def client(self, node: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.nodes[node].base_url, api_key=self.key, max_retries=0
        )

    async def ask(self, node: str, messages: list[dict[str, str]], **kw: Any) -> Any:
        """A greedy answer through `node`, with the response headers."""
        raw = await self.client(node).chat.completions.with_raw_response.create(
            model="deepseek-chat", messages=messages, temperature=0, max_tokens=4, **kw
        )
        return raw.parse(), raw.headers

    async def holds(self, observer: str, holder: str, min_blocks: int) -> None:
        await wait_for(
            self.session,
            self.nodes[observer],
            lambda s: s["nodes"].get(holder, {}).get("blocks", 0) >= min_blocks,
            what=f"saw {min_blocks} blocks on {holder}",
        )


@asynccontextmanager
async def open_cluster(
    names: list[str], tmp: Path, model_path: Path, redis_url: str = REDIS_URL, **kw: Any
) -> AsyncIterator[Cluster]:
    """Node processes `names` on one fresh key prefix, each seeing all others, with one key."""
    prefix = f"test:{uuid.uuid4().hex}:"
    config = write_node_config(
        tmp / "node.toml", node_sections(prefix, redis_url, model_path, **kw)
    )
    async with Redis.from_url(redis_url) as redis:
        secret, _ = await KeyStore(redis, prefix=prefix).create(KeyCreate(name="e2e"))
    nodes = {name: start_node(name, config, tmp) for name in names}
    session = aiohttp.ClientSession()
    try:
        await wait_cluster(session, list(nodes.values()))
        yield Cluster(nodes, secret, prefix, session)
    finally:
        await session.close()
        for node in nodes.values():
            node.stop()
        async with Redis.from_url(redis_url) as redis:  # Redis may have restarted since
            keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
            if keys:
                await redis.delete(*keys)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(
    tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cluster]:
    async with open_cluster(["a", "b"], tmp_path_factory.mktemp("pair"), tiny_checkpoint) as c:
        yield c


async def readyz(cluster: Cluster, node: str) -> dict[str, Any]:
    async with cluster.session.get(cluster.nodes[node].root + "/readyz") as resp:
        body: dict[str, Any] = await resp.json()
        return body


def placement(headers: Any) -> tuple[str, str]:
    """(node, via) from the route explanation: where the local engine's prompt ran."""
    fields = dict(f.split("=", 1) for f in headers["x-gateway-route"].split("; "))
    return fields["node"], fields["via"]


def cached_tokens(resp: Any) -> int:
    details = resp.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details else 0


async def test_a_conversation_is_served_where_its_prefix_is(pair: Cluster) -> None:
    first = conversation("pair", 1)
    resp, headers = await pair.ask("a", first)
    assert placement(headers) == ("a", "local")
    prompt_blocks = (resp.usage.prompt_tokens - 1) // BLOCK
    await pair.holds("b", "a", prompt_blocks)
    # b weighs a's load as a's last heartbeat reported it: wait until that says a is idle
    await wait_for(
        pair.session,
        pair.nodes["b"],
        lambda s: (
            (a := s["nodes"].get("a", {})).get("blocks", 0) >= prompt_blocks
            and a.get("waiting") == 0
            and a.get("running_tokens") == 0
        ),
        what="saw a idle, holding the first turn",
    )
    # the next turn reaches b, which forwards it to a, where the history is cached
    second = next_turn(first, "Fog.", "And?")
    resp, headers = await pair.ask("b", second)
    if placement(headers) != ("a", "forward"):  # what b saw of a, to tell why
        seen = await cluster_status(pair.session, pair.nodes["b"])
        pytest.fail(f"{headers['x-gateway-route']}; b's view: {seen}")
    assert cached_tokens(resp) >= prompt_blocks * BLOCK - BLOCK
    assert resp.choices[0].finish_reason == "length"
    # streamed through as well, usage included: once b has seen a idle again (its load as a
    # heartbeat last reported it is what placement weighs) and holding this turn's blocks
    second_blocks = (resp.usage.prompt_tokens - 1) // BLOCK
    await wait_for(
        pair.session,
        pair.nodes["b"],
        lambda s: (
            (a := s["nodes"].get("a", {})).get("blocks", 0) >= second_blocks
            and a.get("waiting") == 0
            and a.get("running_tokens") == 0
        ),
        what="saw a idle, holding the second turn",
    )
    raw = await pair.client("b").chat.completions.with_raw_response.create(
        model="deepseek-chat",
        messages=second,
        temperature=0,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    if placement(raw.headers) != ("a", "forward"):  # what b saw of a, to tell why
        seen = await cluster_status(pair.session, pair.nodes["b"])
        pytest.fail(f"{raw.headers['x-gateway-route']}; b's view: {seen}")
    stream = raw.parse()
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert text == resp.choices[0].message.content
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) >= prompt_blocks * BLOCK


async def test_the_internal_endpoint_takes_only_the_node_secret(pair: Cluster) -> None:
    url = pair.nodes["a"].root + GENERATE_PATH
    body = {"request_id": "x", "prompt_ids": [0, 1, 2], "params": {"max_tokens": 1}}
    for headers in (
        {"Authorization": f"Bearer {pair.key}"},
        {SECRET_HEADER: pair.key},
        {SECRET_HEADER: ""},
    ):
        async with pair.session.post(url, json=body, headers=headers) as resp:
            assert resp.status == 401
    async with pair.session.post(url, data=b"{", headers={SECRET_HEADER: SECRET}) as resp:
        assert resp.status == 400
    async with pair.session.post(url, json=body, headers={SECRET_HEADER: SECRET}) as resp:
        assert resp.status == 200
        lines = [line async for line in resp.content if line.strip()]
        assert b'"finished":true' in lines[-1]


async def test_the_remote_engine_client_is_an_engine(pair: Cluster) -> None:
    """What a same-host worker or a peer uses: AsyncEngine's contract over the endpoint."""
    remote = RemoteEngine(pair.session, pair.nodes["a"].root, SECRET)
    params = SamplingParams(temperature=0.0, max_tokens=3)
    outputs = [o async for o in remote.generate("r1", list(range(2, 40)), params)]
    assert outputs[-1].finished and outputs[-1].finish_reason == "length"
    assert sum(len(o.new_token_ids) for o in outputs) == 3
    assert outputs[-1].num_prompt_tokens == 38
    with pytest.raises(ValueError):
        _ = [o async for o in remote.generate("r2", [], params)]
    gone = RemoteEngine(pair.session, f"http://127.0.0.1:{free_port()}", SECRET)
    with pytest.raises(PeerUnreachable):
        _ = [o async for o in gone.generate("r3", [2, 3], params)]
    # a process on the same host reaches the engine over the node's unix socket
    root, path = split_base(f"unix:{pair.nodes['a'].log_path.with_suffix('.sock')}")
    assert path is not None
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as local:
        outputs = [
            o async for o in RemoteEngine(local, root, SECRET).generate("r4", [2, 3], params)
        ]
    assert outputs[-1].finished and outputs[-1].num_prompt_tokens == 2


async def test_a_stale_entry_costs_only_a_recompute(pair: Cluster, tiny_checkpoint: Path) -> None:
    """A ghost node claims a prompt's blocks (as a node would whose eviction event has not
    arrived yet) and is reached at b's address, where nothing is cached: b recomputes."""
    messages = conversation("stale", 1)
    tokenizer = Tokenizer.from_dir(tiny_checkpoint)
    ids = tokenizer.encode_chat(messages, thinking=False)
    seed = checkpoint_fingerprint(tiny_checkpoint)
    root = root_hash(seed, BLOCK)
    hashes = chain_hashes(seed, ids, BLOCK)
    buffer = BlockEventBuffer()
    parent = root
    for i, h in enumerate(hashes):
        buffer.push(BlockStored(h, parent, tuple(ids[i * BLOCK : (i + 1) * BLOCK])))
        parent = h
    b_url = pair.nodes["b"].root

    def record(epoch: int) -> NodeRecord:
        return NodeRecord(b_url, root.hex(), epoch, 0, 0, 10_000, 10_000)

    settings = ClusterSettings(heartbeat_s=0.2, liveness_ttl_s=1.5)
    redis = Redis.from_url(REDIS_URL)
    ghost = BlockPublisher(redis, ClusterKeys(pair.prefix), "ghost", buffer, record, settings)
    await ghost.start()
    task = asyncio.create_task(ghost.run())
    try:
        await pair.holds("a", "ghost", len(hashes) - 1)
        resp, headers = await pair.ask("a", messages)
        assert placement(headers) == ("ghost", "forward")
        assert cached_tokens(resp) == 0  # b had none of it: computed in full
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ghost.close()
        await wait_for(pair.session, pair.nodes["a"], lambda s: "ghost" not in s["nodes"])
        # b now really holds the prompt: the next ask is a hit there, with the same answer
        again, headers = await pair.ask("a", messages)
        assert placement(headers) == ("b", "forward")
        assert cached_tokens(again) > 0
        assert again.choices[0].message.content == resp.choices[0].message.content
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ghost.close()
        await redis.aclose()


async def test_a_killed_node_fails_only_its_requests_in_flight(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    async with open_cluster(
        ["a", "b", "c"], tmp_path, tiny_checkpoint, log_level="info"
    ) as cluster:
        first = conversation("kill", 1)
        resp, _ = await cluster.ask("c", first)
        blocks = (resp.usage.prompt_tokens - 1) // BLOCK
        await cluster.holds("a", "c", blocks)
        # what a sees of its peers is public: /readyz's detail and /metrics
        peers = {p["node"]: p for p in (await readyz(cluster, "a"))["cluster"]["peers"]}
        assert set(peers) == {"b", "c"}
        assert all(p["live"] and p["compatible"] and not p["left_out"] for p in peers.values())
        assert peers["c"]["cached_blocks"] >= blocks
        assert peers["c"]["url"] == cluster.nodes["c"].root
        async with cluster.session.get(cluster.nodes["a"].root + "/metrics") as got:
            scraped = await got.text()
        assert 'gateway_cluster_peer_live{peer="c"} 1.0' in scraped
        assert 'gateway_cluster_peer_compatible{peer="b"} 1.0' in scraped
        assert "gateway_cluster_peers 2.0" in scraped
        later = [
            *first,
            {"role": "assistant", "content": "Calm."},
            {"role": "user", "content": "?"},
        ]
        # a long answer forwarded to c; c dies while it streams
        stream = await stream_placed_on(cluster, "a", "c", later)
        with pytest.raises(openai.APIError):
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    cluster.nodes["c"].kill()
        # the conversation goes on elsewhere, before and after c's liveness expires
        resp, headers = await cluster.ask("a", later)
        assert resp.choices[0].finish_reason == "length"
        # c is not yet known dead here: chosen, found unreachable, served by a itself
        assert placement(headers) in {("a", "local"), ("b", "forward"), ("a", "fallback")}
        await wait_for(cluster.session, cluster.nodes["b"], lambda s: "c" not in s["nodes"])
        resp, headers = await cluster.ask("b", later)
        assert resp.choices[0].finish_reason == "length"
        assert placement(headers)[0] != "c"
        peers = {p["node"]: p for p in (await readyz(cluster, "b"))["cluster"]["peers"]}
        assert peers["c"] == {"node": "c", "live": False} and peers["a"]["live"]
        # b logged each transition of its peers once: a joined, c joined and left (a node
        # stalled past its liveness TTL on a loaded machine would add a leave and a join)
        lines = cluster.nodes["b"].log_path.read_text().splitlines()
        seen: dict[str, list[str]] = {}
        for line in map(json.loads, (x for x in lines if x.startswith("{"))):
            if line.get("event", "").startswith("cluster_peer_"):
                seen.setdefault(line["peer"], []).append(line["event"].removeprefix("cluster_"))
        for peer, last in (("a", "peer_joined"), ("c", "peer_left")):
            events = seen[peer]
            assert events[0] == "peer_joined" and events[-1] == last, seen
            assert all(x != y for x, y in itertools.pairwise(events)), seen
        assert set(seen) == {"a", "c"}, seen


async def stream_placed_on(
    cluster: Cluster, node: str, holder: str, messages: list[dict[str, str]]
) -> Any:
    """A long greedy stream through `node` that runs on `holder`. On a loaded machine a
    placement may pass `holder` over (its liveness lapsed for a moment, or it looked
    unreachable): such a stream is closed and the turn asked again, within a deadline."""
    deadline = time.monotonic() + 60
    while True:
        raw = await cluster.client(node).chat.completions.with_raw_response.create(
            model="deepseek-chat", messages=messages, temperature=0, max_tokens=2000, stream=True
        )
        stream = raw.parse()
        where = placement(raw.headers)
        if where[0] == holder:
            return stream
        await stream.close()
        assert time.monotonic() < deadline, f"never placed on {holder}, last on {where}"
        await asyncio.sleep(0.5)


async def ask_when_redis_answers(cluster: Cluster, node: str, messages: Any) -> Any:
    """The keyed path's Redis connection reconnects on its first use after the restart (a
    503 then, by design): ask until admission answers, within a deadline."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await cluster.ask(node, messages)
        except openai.InternalServerError as exc:
            if exc.status_code != 503 or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_redis_restarted_indexes_are_rebuilt(tiny_checkpoint: Path, tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path / "redis")
    server.dir.mkdir()
    server.start()
    try:
        async with open_cluster(
            ["a", "b"], tmp_path, tiny_checkpoint, redis_url=server.url()
        ) as cluster:
            first = conversation("restart", 1)
            resp, _ = await cluster.ask("a", first)
            blocks = (resp.usage.prompt_tokens - 1) // BLOCK
            await cluster.holds("b", "a", blocks)
            server.stop()
            await wait_for(cluster.session, cluster.nodes["b"], lambda s: not s["nodes"])
            server.start()
            await cluster.holds("b", "a", blocks)  # rebuilt from Redis alone
            later = [
                *first,
                {"role": "assistant", "content": "Rain."},
                {"role": "user", "content": "!"},
            ]
            resp, headers = await ask_when_redis_answers(cluster, "b", later)
            assert placement(headers) == ("a", "forward")
            assert cached_tokens(resp) >= blocks * BLOCK - BLOCK
            again, _ = await cluster.ask("a", later)
            assert again.choices[0].message.content == resp.choices[0].message.content
    finally:
        server.stop()


FROZEN = {
    # b's liveness key outlives the test's phases: a keeps placing prompts on the frozen b, so
    # only the forwarding deadlines stand between a request and a hang.
    "liveness_ttl_s": 120.0,
    # Placement follows the prefix alone: b may freeze before it reports the third turn's blocks
    # or after it reported a queued request, and neither may move the fourth turn off b.
    "pending_s": 120.0,
    "waiting_cost_tokens": 0.0,
    "running_token_weight": 0.0,
    "forward_first_byte_timeout_s": 4.0,
    "forward_idle_timeout_s": 4.0,
    "forward_keepalive_s": 0.5,
}
HANG_S = 60.0  # far past every deadline above: a request still open then hangs


def route_fields(headers: Any) -> dict[str, str]:
    return dict(f.split("=", 1) for f in headers["x-gateway-route"].split("; "))


async def test_a_frozen_peer_costs_a_deadline_not_a_hang(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """b holds the conversation and is stopped (SIGSTOP: its port accepts, nothing answers):
    an answer b was streaming ends with an error event, and turns placed on b are served by a,
    over kept-alive connections to b and new ones alike."""
    async with open_cluster(
        ["a", "b"],
        tmp_path,
        tiny_checkpoint,
        cluster=FROZEN,
        server={"stream_headers_after_s": 0.2},
    ) as cluster:
        first = conversation("frozen", 1)
        resp, _ = await cluster.ask("b", first)
        await cluster.holds("a", "b", (resp.usage.prompt_tokens - 1) // BLOCK)
        # two forwards at once: two connections from a to b, kept alive for the next ones
        second = next_turn(first, "Fog.", "And?")
        answers = await asyncio.gather(cluster.ask("a", second), cluster.ask("a", second))
        assert ("b", "forward") in [placement(headers) for _, headers in answers]
        blocks = (answers[0][0].usage.prompt_tokens - 1) // BLOCK
        await wait_for(
            cluster.session,
            cluster.nodes["a"],
            lambda s: (
                (b := s["nodes"].get("b", {})).get("blocks", 0) >= blocks
                and b.get("waiting") == 0
                and b.get("running_tokens") == 0
            ),
            what="saw b idle, holding the second turn",
        )
        third = next_turn(second, "Rain.", "Then?")
        # b stops in the middle of an answer: the stream ends with an error event
        async with asyncio.timeout(HANG_S):
            raw = await cluster.client("a").chat.completions.with_raw_response.create(
                model="deepseek-chat", messages=third, temperature=0, max_tokens=2000, stream=True
            )
            assert placement(raw.headers) == ("b", "forward")
            with pytest.raises(openai.APIError, match="failed while answering"):
                async for chunk in raw.parse():
                    if chunk.choices and chunk.choices[0].delta.content:
                        cluster.nodes["b"].freeze()
        # b stays frozen and live: a JSON turn and a streamed one placed on it are served by a
        fourth = next_turn(third, "Snow.", "Now?")

        async def streamed() -> tuple[Any, str]:
            raw = await cluster.client("a").chat.completions.with_raw_response.create(
                model="deepseek-chat",
                messages=fourth,
                temperature=0,
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = "", None
            async for chunk in raw.parse():
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                usage = chunk.usage or usage
            return raw.headers, (text, usage)

        async with asyncio.timeout(HANG_S):
            (resp, headers), (early, (text, usage)) = await asyncio.gather(
                cluster.ask("a", fourth), streamed()
            )
        assert resp.choices[0].finish_reason == "length"
        assert route_fields(headers)["via"] == "fallback", headers["x-gateway-route"]
        assert route_fields(headers)["tried"] == "b"
        # the stream's headers went out before its first token, while b was still tried
        assert placement(early) == ("b", "forward"), early["x-gateway-route"]
        assert "prefix" in route_fields(early)
        assert text == resp.choices[0].message.content
        assert usage is not None and usage.completion_tokens == 4


@pytest.mark.slow
async def test_nodes_with_data_parallel_attention_share_prefixes_by_rank(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """Two nodes of 2 attention ranks each: they publish their blocks with ranks (index format
    2) and a conversation's next turn asked on the other node is forwarded to the one whose
    rank holds its history, and served there from that rank's cache. On this loaded machine a
    node's published load can show a request in its queue at the moment of the choice (then
    serving locally is right): up to three conversations are tried, each new."""
    engine = {"tensor_parallel": 2, "data_parallel_attention": True}
    async with open_cluster(["a", "b"], tmp_path, tiny_checkpoint, engine=engine) as dp:
        views = []
        for attempt in range(3):
            first = conversation(f"ranks-{attempt}", 1)
            resp, headers = await dp.ask("a", first)
            assert placement(headers) == ("a", "local")
            prompt_blocks = (resp.usage.prompt_tokens - 1) // BLOCK
            await wait_for(
                dp.session,
                dp.nodes["b"],
                lambda s, n=prompt_blocks: (
                    (a := s["nodes"].get("a", {})).get("blocks", 0) >= n
                    and a.get("waiting") == 0
                    and a.get("running_tokens") == 0
                ),
                what="saw a idle, holding the first turn",
            )
            keys = ClusterKeys(dp.prefix)
            async with Redis.from_url(REDIS_URL) as redis:
                record = NodeRecord.loads(await redis.get(keys.live("a")))
                entries = await redis.xrange(keys.stream("a"))
            assert record.cache_root.endswith("+ranked")
            assert entries and all(b"r" in fields for _, fields in entries)
            second = next_turn(first, "Fog.", "And?")
            resp, headers = await dp.ask("b", second)
            if placement(headers) == ("a", "forward"):
                assert cached_tokens(resp) >= prompt_blocks * BLOCK - BLOCK
                return
            seen = await cluster_status(dp.session, dp.nodes["b"])
            views.append(f"{headers['x-gateway-route']}; b's view: {seen}")
        pytest.fail("\n".join(views))
