"""AsyncEngine: the step loop thread, streaming, cancellation, overload, failure and shutdown."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from backend.engine.async_engine import (
    AsyncEngine,
    EngineClosed,
    EngineError,
    EngineOverloaded,
    PromptTooLong,
    RequestOutput,
)
from backend.engine.engine_config import EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.model.fingerprint import checkpoint_fingerprint
from backend.model.model import DeepseekV3ForCausalLM
from tests.support.engine import (
    GREEDY,
    engine_config,
    make_engine,
    random_prompts,
    run_all,
    tokens_of,
)


@pytest.fixture
async def start_engine(tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path) -> AsyncIterator[Any]:
    """Factory of started engines over the shared model; all are stopped at teardown."""
    engines: list[AsyncEngine] = []

    def start(config: EngineConfig | None = None) -> AsyncEngine:
        engine = AsyncEngine(make_engine(tiny_model, tiny_dir, config))
        engine.start()
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        await engine.stop()


async def _collect(
    engine: AsyncEngine, request_id: str, prompt: list[int], params: SamplingParams = GREEDY
) -> list[RequestOutput]:
    return [output async for output in engine.generate(request_id, prompt, params)]


async def _until_idle(engine: AsyncEngine) -> None:
    for _ in range(500):
        stats = engine.stats()
        if stats.num_running == stats.num_waiting == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not go idle: {engine.stats()}")


async def test_concurrent_streams_match_the_sync_engine(
    start_engine: Any, tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    prompts = random_prompts(8, 3, 40, seed=20)
    expected = run_all(
        make_engine(tiny_model, tiny_dir), [(r, p, GREEDY) for r, p in prompts.items()]
    )
    engine = start_engine()
    results = await asyncio.gather(*(_collect(engine, r, p) for r, p in prompts.items()))
    for (rid, _), outputs in zip(prompts.items(), results, strict=True):
        assert tokens_of(outputs) == tokens_of(expected[rid])
        assert outputs[-1].finished and outputs[-1].finish_reason == "length"
        assert len(outputs) == GREEDY.max_tokens  # streamed one token per step
    stats = engine.stats()
    assert stats.num_generated_tokens_total == 8 * GREEDY.max_tokens
    assert stats.num_batched_seqs_total > stats.num_steps_total  # requests shared steps


async def test_cancelled_requests_free_their_blocks(start_engine: Any) -> None:
    engine = start_engine(engine_config(max_waiting=256))
    initial = engine.stats().num_free_blocks
    rng = random.Random(21)
    prompts = random_prompts(200, 2, 60, seed=21)
    params = replace(GREEDY, max_tokens=1000)  # no request ends by itself

    async def consume(request_id: str, prompt: list[int], stop_after: int) -> None:
        stream = engine.generate(request_id, prompt, params)
        received = 0
        async for _ in stream:
            received += 1
            if received == stop_after:
                await stream.aclose()  # the consumer walks away mid-stream
                return

    tasks = [
        asyncio.create_task(consume(rid, prompt, rng.randint(1, 20)))
        for rid, prompt in prompts.items()
    ]
    await asyncio.sleep(0.05)
    for task in tasks:
        if rng.random() < 0.5:
            task.cancel()
        if rng.random() < 0.1:
            await asyncio.sleep(0.005)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert any(isinstance(r, asyncio.CancelledError) for r in results)
    assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results)
    await _until_idle(engine)
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks == initial


async def test_overload_refuses_at_once_while_admitted_requests_complete(
    start_engine: Any,
) -> None:
    engine = start_engine(engine_config(max_num_seqs=2, max_waiting=3))
    params = replace(GREEDY, max_tokens=20)
    prompts = random_prompts(12, 5, 10, seed=22)
    results = await asyncio.gather(
        *(_collect(engine, rid, prompt, params) for rid, prompt in prompts.items()),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, EngineOverloaded)]
    served = [r for r in results if isinstance(r, list)]
    assert len(refused) + len(served) == len(prompts)
    assert len(refused) >= 5 and len(served) >= 3
    assert all(r.retry_after_s >= 1.0 for r in refused)
    assert all(len(tokens_of(outputs)) == 20 for outputs in served)


async def test_queue_counts_are_what_stats_counts(start_engine: Any) -> None:
    engine = start_engine(engine_config(max_num_seqs=1))
    params = replace(GREEDY, max_tokens=30)
    prompts = random_prompts(3, 5, 10, seed=5)
    tasks = [asyncio.ensure_future(_collect(engine, r, p, params)) for r, p in prompts.items()]
    seen = set()
    while not all(t.done() for t in tasks):
        counts, stats = engine.queue_counts(), engine.stats()
        if counts == (stats.num_waiting, stats.num_running):  # no step ran in between
            seen.add(counts)
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)
    assert (2, 1) in seen  # one running of max_num_seqs 1, two waiting
    assert all(running <= 1 for _, running in seen)
    assert engine.queue_counts() == (0, 0)


async def test_finish_ends_a_request_with_the_given_reason(start_engine: Any) -> None:
    engine = start_engine()
    stream = engine.generate("f", [5, 6, 7, 8], replace(GREEDY, max_tokens=100))
    outputs = [await anext(stream)]
    engine.finish("f", "stop")
    outputs += [output async for output in stream]
    assert outputs[-1].finished and outputs[-1].finish_reason == "stop"
    assert len(tokens_of(outputs)) < 100
    await _until_idle(engine)
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


async def test_bad_requests_raise_before_anything_is_queued(
    start_engine: Any, tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    engine = start_engine(engine_config(max_model_len=32))
    with pytest.raises(PromptTooLong):
        await _collect(engine, "long", list(range(2, 40)))
    with pytest.raises(ValueError, match="token ids"):
        await _collect(engine, "oov", [1, 1_000_000])
    first = engine.generate("dup", [4, 5], replace(GREEDY, max_tokens=50))
    await anext(first)
    with pytest.raises(ValueError, match="in flight"):
        await _collect(engine, "dup", [4, 5])
    await first.aclose()
    again = await _collect(engine, "dup", [4, 5])  # the id is free again at once
    assert [len(o.new_token_ids) for o in again] == [1] * GREEDY.max_tokens
    assert tokens_of(again) == tokens_of(
        run_all(make_engine(tiny_model, tiny_dir), [("d", [4, 5], GREEDY)])["d"]
    )


async def test_stop_aborts_in_flight_requests_and_refuses_new_ones(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    engine = AsyncEngine(make_engine(tiny_model, tiny_dir))
    with pytest.raises(EngineClosed):
        await _collect(engine, "early", [3, 4])
    assert not engine.is_running
    engine.start()
    assert engine.is_running
    stream = engine.generate("long", [3, 4, 5], replace(GREEDY, max_tokens=1000))
    await anext(stream)
    await engine.stop()
    rest = [output async for output in stream]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert not engine.is_running
    with pytest.raises(EngineClosed):
        await _collect(engine, "late", [3, 4])
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


async def test_stop_with_grace_lets_requests_finish(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    engine = AsyncEngine(make_engine(tiny_model, tiny_dir))
    engine.start()
    stream = engine.generate("g", [3, 4, 5], replace(GREEDY, max_tokens=10))
    first = await anext(stream)
    await engine.stop(grace_s=30.0)
    rest = [output async for output in stream]
    assert rest[-1].finish_reason == "length"
    assert len(tokens_of([first, *rest])) == 10


async def test_a_failing_step_fails_its_requests_and_the_engine_recovers(
    start_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = start_engine()
    runner = engine._engine.runner
    execute = runner.execute
    calls = {"n": 0}

    def flaky(output: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated kernel failure")
        return execute(output)

    monkeypatch.setattr(runner, "execute", flaky)
    with pytest.raises(EngineError, match="failed this request") as failure:
        await _collect(engine, "victim", [3, 4, 5], replace(GREEDY, max_tokens=10))
    assert isinstance(failure.value.__cause__, RuntimeError)
    await _until_idle(engine)
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks
    after = await _collect(engine, "next", [3, 4, 5])
    assert after[-1].finish_reason == "length"


async def test_from_checkpoint_seeds_hashes_with_the_fingerprint(
    tiny_dir: Path,
) -> None:
    config = engine_config()
    engine = AsyncEngine.from_checkpoint(tiny_dir, config)
    assert engine.hash_seed == checkpoint_fingerprint(tiny_dir)
    assert engine.max_model_len == 2048 and engine.block_size == 16
    engine.start()
    try:
        outputs = await _collect(engine, "c", [9, 8, 7], SamplingParams(max_tokens=3, seed=1))
    finally:
        await engine.stop()
    assert len(tokens_of(outputs)) == 3


async def test_a_request_the_engine_refuses_fails_alone(
    start_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = start_engine()
    sync_engine = engine._engine
    add_request = sync_engine.add_request

    def refuse_odd(
        request_id: str, prompt: list[int], params: SamplingParams, grammar: object = None
    ) -> None:
        if request_id == "odd":
            raise ValueError("refused by the engine")
        add_request(request_id, prompt, params, grammar)

    monkeypatch.setattr(sync_engine, "add_request", refuse_odd)
    refused, served = await asyncio.gather(
        _collect(engine, "odd", [3, 4]), _collect(engine, "even", [3, 4]), return_exceptions=True
    )
    assert isinstance(refused, ValueError) and "refused" in str(refused)
    assert isinstance(served, list) and served[-1].finish_reason == "length"


async def test_a_dead_engine_thread_fails_every_request_instead_of_hanging(
    start_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = start_engine()
    sync_engine = engine._engine

    def broken(*args: Any) -> Any:
        raise RuntimeError("corrupted state")

    monkeypatch.setattr(sync_engine, "step", broken)
    monkeypatch.setattr(sync_engine, "abort_all", broken)
    results = await asyncio.wait_for(
        asyncio.gather(
            *(_collect(engine, f"r{i}", [3, 4, i + 5]) for i in range(4)), return_exceptions=True
        ),
        timeout=10,
    )
    # queued before the thread died: EngineError; submitted after: EngineClosed
    assert all(isinstance(r, EngineError | EngineClosed) for r in results), results
    assert isinstance(results[0], EngineError)
    with pytest.raises(EngineClosed):
        await _collect(engine, "after", [3, 4])
    assert not engine.is_running


async def test_a_dead_engine_is_down_before_its_requests_hear_of_it(
    start_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose request failed with the engine and asks at once whether the engine
    runs (as /readyz does) hears no: the engine is down before it fails the streams, however
    long it takes to wind down after."""
    engine = start_engine()
    sync_engine = engine._engine

    def broken(*args: Any) -> Any:
        raise RuntimeError("corrupted state")

    fail_streams = engine._fail_streams

    def slow_after(*args: Any) -> None:
        fail_streams(*args)
        time.sleep(0.3)  # the engine thread lingers after telling the streams

    monkeypatch.setattr(sync_engine, "step", broken)
    monkeypatch.setattr(sync_engine, "abort_all", broken)
    monkeypatch.setattr(engine, "_fail_streams", slow_after)
    with pytest.raises(EngineError):
        await asyncio.wait_for(_collect(engine, "r", [3, 4, 5]), timeout=10)
    assert not engine.is_running
    assert isinstance(engine.failure, RuntimeError)
