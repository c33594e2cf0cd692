"""Data-parallel attention with CUDA tensors: ranks share one GPU and talk over gloo, each
attending to its own sequences from its own latent pool with the Triton kernels. Greedy tokens
equal the single-device engine's on the same GPU over batched, chunked-prefill, preempted and
speculative runs, with 2 ranks and with 4 ranks expert-parallel. Needs a CUDA GPU; the CPU runs
of the same checks are ``test_parallel_dp.py``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from backend.model.checkpoint import load_model
from backend.model.model import DeepseekV3ForCausalLM
from backend.parallel.cluster import start_parallel_model
from tests.support.engine import GREEDY, engine_config, make_engine, random_prompts
from tests.support.parallel import assert_greedy_as_one_device, greedy_tokens, parallel_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = {"device": "cuda"}
PLAIN = {**CUDA, "spec_enabled": False}
CHUNKED = {**PLAIN, "max_batch_tokens": 32}
SPECULATIVE = {**CUDA, "spec_enabled": True, "spec_num_tokens": 2, "spec_max_batch_size": None}
DP = {"data_parallel_attention": True}


@pytest.fixture(scope="module")
def cuda_model(tiny_dir: Path) -> DeepseekV3ForCausalLM:
    return load_model(tiny_dir, dtype=torch.float32, device="cuda")


def test_two_ranks_greedy_equals_one_device(
    tiny_dir: Path, cuda_model: DeepseekV3ForCausalLM
) -> None:
    model, _ = start_parallel_model(tiny_dir, parallel_config(2, **CUDA, **DP))
    try:
        assert model.group.backend == "gloo" and model.device.type == "cuda"
        prompts = random_prompts(6, 10, 70, seed=11)
        assert_greedy_as_one_device(
            cuda_model, model, tiny_dir, prompts, PLAIN, (PLAIN, CHUNKED, SPECULATIVE),
            world=2, **DP,
        )  # fmt: skip
        preempting = random_prompts(6, 30, 50, seed=5)
        params = replace(GREEDY, max_tokens=30)
        reference = greedy_tokens(make_engine(cuda_model, tiny_dir, engine_config(**PLAIN)),
                                  preempting, params)  # fmt: skip
        block_bytes = 16 * cuda_model.num_cache_layers * cuda_model.config.latent_dim * 4
        pool = {"max_batch_tokens": 64, "cache_memory_bytes": 12 * block_bytes}
        engine = make_engine(model, tiny_dir, parallel_config(2, **PLAIN, **DP, **pool))
        assert greedy_tokens(engine, preempting, params) == reference
        assert engine.stats().num_preemptions_total > 0
    finally:
        model.close()


def test_four_ranks_expert_parallel_greedy_equals_one_device(
    tiny_dir: Path, cuda_model: DeepseekV3ForCausalLM
) -> None:
    prompts = random_prompts(5, 8, 50, seed=31)
    settings = {"expert_parallel": True, **DP}
    model, _ = start_parallel_model(tiny_dir, parallel_config(4, **CUDA, **settings))
    try:
        assert_greedy_as_one_device(
            cuda_model, model, tiny_dir, prompts, PLAIN, (CHUNKED, SPECULATIVE), world=4,
            **settings,
        )  # fmt: skip
    finally:
        model.close()
