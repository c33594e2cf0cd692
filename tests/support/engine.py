"""Shared pieces of the engine tests (the checkpoint and model come from conftest's `tiny_dir`
and `tiny_model`): engine configs, random prompts and a run-to-completion driver."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from backend.engine.engine_config import EngineConfig, num_cache_blocks
from backend.engine.llm_engine import LLMEngine, RequestOutput
from backend.engine.runner import ModelRunner
from backend.engine.sampling_params import SamplingParams
from backend.model.checkpoint import load_generation_config
from backend.model.model import DeepseekV3ForCausalLM

PROMPT_VOCAB = 512  # prompts draw token ids below this
HASH_SEED = b"engine-tests"
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def engine_config(**overrides: Any) -> EngineConfig:
    """Small pool (about 200 blocks of 16 tokens for the tiny model), fp32, CPU."""
    settings: dict[str, Any] = {
        "max_num_seqs": 16,
        "max_batch_tokens": 256,
        "block_size": 16,
        "cache_memory_bytes": 2 << 20,
        "dtype": "float32",
        "device": "cpu",
        "max_waiting": 64,
        # deterministic drafting: at batch 1 unless a test lifts the cap (no timing decides)
        "spec_max_batch_size": 1,
        "spec_policy": "fixed",
    }
    settings.update(overrides)
    return EngineConfig(**settings)


def make_runner(model: DeepseekV3ForCausalLM, config: EngineConfig) -> ModelRunner:
    """A runner with the pool the engine would give it under `config`."""
    mtp = model.num_mtp_layers > 0
    return ModelRunner(model, config, num_cache_blocks(config, model.config, mtp=mtp))


def make_engine(
    model: DeepseekV3ForCausalLM, model_dir: Path, config: EngineConfig | None = None
) -> LLMEngine:
    return LLMEngine(
        model,
        config or engine_config(),
        hash_seed=HASH_SEED,
        generation_defaults=load_generation_config(model_dir),
    )


def random_prompts(count: int, min_len: int, max_len: int, seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {
        f"req-{i}": [rng.randrange(2, PROMPT_VOCAB) for _ in range(rng.randint(min_len, max_len))]
        for i in range(count)
    }


def run_all(
    engine: LLMEngine,
    requests: Iterable[tuple[str, list[int], SamplingParams]],
) -> dict[str, list[RequestOutput]]:
    """Add every request, step until none is live; each request's outputs in order."""
    outputs: dict[str, list[RequestOutput]] = {}
    for request_id, prompt, params in requests:
        engine.add_request(request_id, prompt, params)
        outputs[request_id] = []
    while engine.has_unfinished:
        for output in engine.step():
            outputs[output.request_id].append(output)
    return outputs


def tokens_of(outputs: list[RequestOutput]) -> list[int]:
    return [token for output in outputs for token in output.new_token_ids]
