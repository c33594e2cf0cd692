"""End to end with data-parallel attention: the openai SDK -> the gateway -> an engine over 2
ranks each attending to its own sequences (``data_parallel_attention = true``) answers exactly
as one device and as tensor parallel, streamed and not, thinking on and off; a dead worker
rank makes the next answer a clean 502."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import openai
import pytest

from tests.support.local_gateway import open_local_gateway
from tests.support.parallel import USER, answers, client, worker_pids

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="function")]


async def test_data_parallel_attention_answers_as_one_and_as_tensor_parallel(
    tiny_checkpoint: Path,
) -> None:
    async with open_local_gateway(tiny_checkpoint) as one:
        expected = await answers(one)
    async with open_local_gateway(tiny_checkpoint, tensor_parallel=2) as tp:
        assert await answers(tp) == expected
    async with open_local_gateway(
        tiny_checkpoint, tensor_parallel=2, data_parallel_attention=True
    ) as dp:
        assert len(worker_pids()) == 1
        assert await answers(dp) == expected
        os.kill(worker_pids()[1], signal.SIGKILL)
        with pytest.raises(openai.APIStatusError) as caught:
            await client(dp).chat.completions.create(
                model="deepseek-chat", messages=USER, max_tokens=200, temperature=0
            )
        assert caught.value.status_code == 502
        assert "upstream_unavailable" in str(caught.value.body)
    assert worker_pids() == {}
