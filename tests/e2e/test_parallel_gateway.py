"""End to end with the parallel engine: the openai SDK -> the gateway -> the local provider
whose engine runs over 2 ranks (``[engine] tensor_parallel = 2``, a worker process it starts)
answers exactly as with one, streamed and not, thinking on and off; a worker that dies makes
the engine's answers 502 upstream_unavailable instead of hanging, /readyz says the local
provider is down and which rank took it down (so does /metrics)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.support.local_gateway import open_local_gateway
from tests.support.parallel import USER, answers, client, worker_pids

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="function")]


async def test_two_ranks_answer_as_one(tiny_checkpoint: Path) -> None:
    async with open_local_gateway(tiny_checkpoint) as one:
        expected = await answers(one)
    async with open_local_gateway(tiny_checkpoint, tensor_parallel=2) as two:
        assert len(worker_pids()) == 1
        assert await answers(two) == expected
        # a dead worker rank: the engine goes down and the next answer is a clean 502
        os.kill(worker_pids()[1], signal.SIGKILL)
        with pytest.raises(openai.APIStatusError) as caught:
            await client(two).chat.completions.create(
                model="deepseek-chat", messages=USER, max_tokens=200, temperature=0
            )
        assert caught.value.status_code == 502
        assert "upstream_unavailable" in str(caught.value.body)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{two.root}/readyz") as ready:
                assert ready.status == 503
                body = await ready.json()
            async with session.get(f"{two.root}/metrics") as scraped:
                metrics = await scraped.text()
        assert body["checks"]["engine:local"] is False
        down = body["engines_down"]["local"]
        assert down["ranks"] == {"1": "exited with code -9"}
        assert "rank 1 exited with code -9" in down["reason"]
        assert 'gateway_engine_rank_down{provider="local",rank="1"} 1.0' in metrics
    assert worker_pids() == {}
