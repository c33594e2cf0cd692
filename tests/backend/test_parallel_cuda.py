"""The parallel engine with CUDA tensors: ranks share one GPU and talk over gloo (NCCL cannot put
two ranks on one GPU), which reduces and broadcasts CUDA tensors in place and stages gathers and
exchanges through the CPU. On the GPU the model runs the Triton kernels. Greedy tokens equal the
single-device engine's on the same GPU over batched, chunked-prefill, prefix-cached and
speculative runs, with 2 ranks and with 4 ranks expert-parallel; logits agree within
CUDA_LOGITS_ATOL. Needs a CUDA GPU; the CPU runs of the same checks are ``test_parallel.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from backend.model.checkpoint import load_model
from backend.model.model import DeepseekV3ForCausalLM
from backend.parallel.cluster import start_parallel_model
from backend.parallel.model import ShardedCausalLM
from tests.support.engine import random_prompts
from tests.support.parallel import (
    assert_greedy_as_one_device,
    assert_logits_close,
    assert_prefix_hits_as_one_device,
    parallel_config,
    prefix_prompts,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# fp32 on the GPU: a rank's kernels split their sums otherwise (the decode's key splits follow
# the heads per rank) and the all-reduces add the ranks' partial sums in another order
CUDA_LOGITS_ATOL = 2e-3

CUDA = {"device": "cuda"}
PLAIN = {**CUDA, "spec_enabled": False}
CHUNKED = {**PLAIN, "max_batch_tokens": 32}
SPECULATIVE = {**CUDA, "spec_enabled": True, "spec_num_tokens": 2, "spec_max_batch_size": None}


@pytest.fixture(scope="module")
def cuda_model(tiny_dir: Path) -> DeepseekV3ForCausalLM:
    return load_model(tiny_dir, dtype=torch.float32, device="cuda")


@pytest.fixture(scope="module")
def cuda_tp2(tiny_dir: Path) -> Iterator[ShardedCausalLM]:
    model, _ = start_parallel_model(tiny_dir, parallel_config(2, **CUDA))
    yield model
    model.close()


def test_ranks_share_the_gpu_over_gloo(cuda_tp2: ShardedCausalLM) -> None:
    assert cuda_tp2.group.backend == "gloo"
    assert cuda_tp2.device.type == "cuda" and cuda_tp2.group.device.type == "cuda"


def test_two_ranks_greedy_equals_one_device(
    tiny_dir: Path, cuda_model: DeepseekV3ForCausalLM, cuda_tp2: ShardedCausalLM
) -> None:
    prompts = random_prompts(6, 10, 70, seed=11)
    runs = (PLAIN, CHUNKED, SPECULATIVE)
    assert_greedy_as_one_device(cuda_model, cuda_tp2, tiny_dir, prompts, PLAIN, runs, world=2)


def test_two_ranks_prefix_cache_hits_give_the_same_tokens(
    tiny_dir: Path, cuda_model: DeepseekV3ForCausalLM, cuda_tp2: ShardedCausalLM
) -> None:
    prompts = prefix_prompts(seed=21)
    assert_prefix_hits_as_one_device(cuda_model, cuda_tp2, tiny_dir, prompts, PLAIN, CHUNKED)


def test_two_ranks_logits_within_tolerance(
    cuda_model: DeepseekV3ForCausalLM, cuda_tp2: ShardedCausalLM
) -> None:
    prompt = random_prompts(1, 37, 37, seed=5)["req-0"]
    assert_logits_close(cuda_tp2, cuda_model, prompt, 17, CUDA_LOGITS_ATOL)


def test_four_ranks_expert_parallel_greedy_equals_one_device(
    tiny_dir: Path, cuda_model: DeepseekV3ForCausalLM
) -> None:
    prompts = random_prompts(5, 8, 50, seed=31)
    model, _ = start_parallel_model(tiny_dir, parallel_config(4, expert_parallel=True, **CUDA))
    try:
        runs = (CHUNKED, SPECULATIVE)
        assert_greedy_as_one_device(
            cuda_model, model, tiny_dir, prompts, PLAIN, runs, world=4, expert_parallel=True
        )
        prompt = random_prompts(1, 29, 29, seed=37)["req-0"]
        assert_logits_close(model, cuda_model, prompt, 9, CUDA_LOGITS_ATOL)
    finally:
        model.close()
