"""A worker rank that dies or hangs mid-stream (with or without data-parallel attention) ends
the parallel engine's requests with an EngineError within a bounded time (the collectives'
timeout, then the diagnosis), the engine reports itself down, the log names the rank, and a
new engine starts afterwards."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path

import pytest

from backend.engine.async_engine import AsyncEngine, EngineError
from backend.engine.sampling_params import SamplingParams
from tests.support.engine import random_prompts
from tests.support.parallel import parallel_config, worker_pids

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0  # the collectives' timeout in these tests
LONG = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)


async def _fail_mid_stream(
    engine: AsyncEngine, signum: int, deadline_s: float
) -> tuple[EngineError, int, float]:
    """Stream a long request, signal rank 1 after its first tokens; the error, the number of
    outputs before it and the seconds from the signal to the error."""
    prompt = random_prompts(1, 12, 12, seed=2)["req-0"]
    outputs = 0
    signalled = 0.0
    stream = engine.generate("long", prompt, LONG)
    with pytest.raises(EngineError) as caught:
        async with asyncio.timeout(deadline_s + 60):
            async for _ in stream:
                outputs += 1
                if outputs == 3:
                    os.kill(worker_pids()[1], signum)
                    signalled = time.monotonic()
    return caught.value, outputs, time.monotonic() - signalled


async def _wait_down(engine: AsyncEngine, deadline_s: float) -> None:
    """Until the engine reports itself not running (its thread ends after failing requests)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not engine.is_running:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the engine still reports running after {deadline_s} s")


async def test_killed_rank_fails_requests_and_the_engine(
    tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="backend.parallel.cluster")
    config = parallel_config(2, parallel_timeout_s=TIMEOUT_S, spec_enabled=False)
    engine = await asyncio.to_thread(AsyncEngine.from_checkpoint, tiny_dir, config)
    engine.start()
    try:
        error, outputs, seconds = await _fail_mid_stream(engine, signal.SIGKILL, TIMEOUT_S)
        assert outputs >= 3
        assert seconds < TIMEOUT_S + 30  # a reset connection fails at once; the bound is loose
        await _wait_down(engine, 30)
        assert "rank 1 exited" in caplog.text
        assert "rank 1 exited" in str(error.__cause__)
    finally:
        await engine.stop()
    # the same checkpoint serves again from a new engine (new ranks, new rendezvous)
    again = await asyncio.to_thread(AsyncEngine.from_checkpoint, tiny_dir, config)
    again.start()
    try:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        got = [o async for o in again.generate("after", [5, 6, 7], params)]
        assert sum(len(o.new_token_ids) for o in got) == 4
    finally:
        await again.stop()
    assert worker_pids() == {}


async def test_killed_rank_ends_a_data_parallel_attention_engine(
    tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The one sequence lives on rank 0; rank 1, with no sequence, still joins every step's
    collectives, so its death fails the step all the same."""
    caplog.set_level(logging.ERROR, logger="backend.parallel.cluster")
    config = parallel_config(
        2, parallel_timeout_s=TIMEOUT_S, spec_enabled=False, data_parallel_attention=True
    )
    engine = await asyncio.to_thread(AsyncEngine.from_checkpoint, tiny_dir, config)
    engine.start()
    try:
        error, outputs, seconds = await _fail_mid_stream(engine, signal.SIGKILL, TIMEOUT_S)
        assert outputs >= 3 and seconds < TIMEOUT_S + 30
        await _wait_down(engine, 30)
        assert "rank 1 exited" in str(error.__cause__)
    finally:
        await engine.stop()
    assert worker_pids() == {}


async def test_hung_rank_times_out_and_is_named(
    tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="backend.parallel.cluster")
    config = parallel_config(2, parallel_timeout_s=TIMEOUT_S, spec_enabled=False)
    engine = await asyncio.to_thread(AsyncEngine.from_checkpoint, tiny_dir, config)
    engine.start()
    stopped = worker_pids()[1]
    try:
        error, _, seconds = await _fail_mid_stream(engine, signal.SIGSTOP, TIMEOUT_S)
        # it waited for the collective's timeout, not the start-up one (parallel_config: 120 s)
        assert TIMEOUT_S * 0.9 <= seconds < TIMEOUT_S + 20
        await _wait_down(engine, 30)
        assert "rank 1 stopped responding" in caplog.text
        assert "rank 1 stopped responding" in str(error.__cause__)
    finally:
        os.kill(stopped, signal.SIGKILL)
        await engine.stop()
