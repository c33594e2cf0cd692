"""An FP8 checkpoint served through the local provider: its linears stay FP8 in memory, and
greedy answers equal those of the same checkpoint dequantized at load (tolerance: identical
tokens; the logits agree to 1e-4 in fp32, see tests/backend/test_fp8_resident.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from backend.demo_checkpoint import write_demo_checkpoint
from backend.engine.engine_config import EngineConfig
from backend.model.dtypes import FP8Weights
from providers.local.setup import load_local_provider
from providers.types import ChatRequest, Message, Sampling, TextDelta, Usage


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_checkpoint(tmp_path_factory.mktemp("local-fp8"), "tiny", use_fp8=True)


async def _answer(checkpoint: Path, fp8_weights: FP8Weights) -> tuple[str, int]:
    config = EngineConfig(
        max_num_seqs=4,
        max_batch_tokens=256,
        block_size=16,
        cache_memory_bytes=1 << 20,
        dtype="float32",
        num_threads=1,
        fp8_weights=fp8_weights,
    )
    request = ChatRequest(
        model="deepseek-v3.1",
        messages=(Message(role="user", content="Name three prime numbers."),),
        sampling=Sampling(temperature=0.0, max_tokens=12),
    )
    async with load_local_provider("local", config, model_path=checkpoint) as provider:
        events = [event async for event in provider.chat(request)]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    (usage,) = [e for e in events if isinstance(e, Usage)]
    return text, usage.completion_tokens


async def test_fp8_served_resident_matches_dequantize_at_load(
    fp8_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="backend.model.checkpoint"):
        resident = await _answer(fp8_checkpoint, "resident")
        at_load = await _answer(fp8_checkpoint, "dequantize")
    loads = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded ")]
    assert len(loads) == 2
    assert "weights=fp8 (resident)" in loads[0]
    assert "weights=fp8 (dequantized at load)" in loads[1]
    assert resident[1] == 12 and resident[0]
    assert resident == at_load


def test_engine_config_rejects_unknown_fp8_mode() -> None:
    with pytest.raises(ValueError, match="fp8_weights"):
        EngineConfig(fp8_weights="int4")  # type: ignore[arg-type]
