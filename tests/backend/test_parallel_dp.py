"""Data-parallel attention on CPU with gloo (``data_parallel_attention = true``): each rank
attends to its own sequences from its own latent pool. 2 ranks, and 4 with expert parallel,
give the single-process engine's greedy tokens over batched, chunked-prefill, prefix-cached,
preempted and speculative runs; the node caches as many tokens as its ranks' pools together;
a prompt goes to the rank whose pool holds its prefix; a step sends what the analytic count
says."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from backend.engine.block_hash import chain_hashes
from backend.engine.llm_engine import LLMEngine
from backend.engine.ranked_blocks import RankedBlockManager
from backend.engine.sampling_params import SamplingParams
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.model import DeepseekV3ForCausalLM
from backend.parallel.cluster import start_parallel_model
from backend.parallel.dp_attention import DataParallelMLA
from backend.parallel.layout import Layout
from backend.parallel.model import ShardedCausalLM
from backend.parallel.sizing import decode_step_bytes, rank_weight_bytes
from tests.support.engine import GREEDY, engine_config, make_engine, random_prompts, run_all
from tests.support.parallel import (
    assert_greedy_as_one_device,
    greedy_tokens,
    one_by_one,
    parallel_config,
    prefix_prompts,
)

pytestmark = pytest.mark.slow

PLAIN = {"spec_enabled": False}
CHUNKED = {"spec_enabled": False, "max_batch_tokens": 32}
SPECULATIVE = {"spec_enabled": True, "spec_num_tokens": 2, "spec_max_batch_size": None}
DP = {"data_parallel_attention": True}


@pytest.fixture(scope="module")
def dp2(tiny_dir: Path) -> Iterator[ShardedCausalLM]:
    model, _ = start_parallel_model(tiny_dir, parallel_config(2, **DP))
    yield model
    model.close()


def _block_bytes(model: DeepseekV3ForCausalLM) -> int:
    return 16 * model.num_cache_layers * model.config.latent_dim * 4  # fp32, 16-token blocks


def test_two_ranks_greedy_equals_one_device(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM, dp2: ShardedCausalLM
) -> None:
    assert dp2.attention_ranks == 2
    assert all(isinstance(layer.self_attn, DataParallelMLA) for layer in dp2.model.layers)
    prompts = random_prompts(6, 10, 70, seed=11)
    params = replace(GREEDY, max_tokens=10, ignore_eos=True)
    assert_greedy_as_one_device(
        tiny_model, dp2, tiny_dir, prompts, PLAIN, (PLAIN, CHUNKED, SPECULATIVE),
        world=2, params=params, **DP,
    )  # fmt: skip
    engine = make_engine(dp2, tiny_dir, parallel_config(2, **DP, **PLAIN))
    greedy_tokens(engine, prompts, params)
    pools = engine.block_manager
    assert isinstance(pools, RankedBlockManager)
    assert all(pool.num_cached_blocks > 0 for pool in pools.pools)  # both ranks served


def test_preempted_sequences_recompute_the_same_tokens(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM, dp2: ShardedCausalLM
) -> None:
    prompts = random_prompts(6, 30, 50, seed=5)
    params = replace(GREEDY, max_tokens=30)
    reference = greedy_tokens(make_engine(tiny_model, tiny_dir), prompts, params)
    pool = {"max_batch_tokens": 64, "cache_memory_bytes": 12 * _block_bytes(tiny_model)}
    engine = make_engine(dp2, tiny_dir, parallel_config(2, **DP, **pool))
    assert engine.runner.num_blocks == 12 and engine.stats().num_total_blocks == 24
    assert greedy_tokens(engine, prompts, params) == reference
    stats = engine.stats()
    assert stats.num_preemptions_total > 0
    assert stats.num_free_blocks == stats.num_total_blocks


def _peaks(
    engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams
) -> tuple[int, int]:
    """Run ``prompts`` at once: the most blocks in use and sequences running in one step."""
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, params)
    held = running = 0
    while engine.has_unfinished:
        engine.step()
        stats = engine.stats()
        held = max(held, stats.num_total_blocks - stats.num_free_blocks)
        running = max(running, stats.num_running)
    return held, running


def test_the_node_caches_its_ranks_pools_together(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM, dp2: ShardedCausalLM
) -> None:
    """Four sequences of 6 blocks each fill two 12-block pools at once; one device with the
    same pool per GPU (as tensor parallel has: every rank caches every token) holds two."""
    prompts = random_prompts(4, 80, 80, seed=8)
    params = replace(GREEDY, max_tokens=12, ignore_eos=True)  # 91 tokens cached: 6 blocks
    pool = {"cache_memory_bytes": 12 * _block_bytes(tiny_model), **PLAIN}
    single = make_engine(tiny_model, tiny_dir, engine_config(**pool))
    assert _peaks(single, prompts, params) == (12, 2)
    engine = make_engine(dp2, tiny_dir, parallel_config(2, **DP, **pool))
    assert _peaks(engine, prompts, params) == (24, 4)
    assert engine.stats().num_preemptions_total == 0
    expected = greedy_tokens(make_engine(tiny_model, tiny_dir, engine_config(**pool)), prompts,
                             params)  # fmt: skip
    again = make_engine(dp2, tiny_dir, parallel_config(2, **DP, **pool))
    assert greedy_tokens(again, prompts, params) == expected


def test_a_prefix_is_found_on_the_rank_that_holds_it(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM, dp2: ShardedCausalLM
) -> None:
    prompts = prefix_prompts(seed=21)
    expected, _ = one_by_one(make_engine(tiny_model, tiny_dir, engine_config(**PLAIN)), prompts,
                             GREEDY)  # fmt: skip
    engine = make_engine(dp2, tiny_dir, parallel_config(2, **DP, **PLAIN))
    pools = engine.block_manager
    assert isinstance(pools, RankedBlockManager)
    filler = random_prompts(1, 30, 30, seed=99)["req-0"]
    # the filler takes rank 0, so req-0 (and its 40-token head) goes to rank 1
    run_all(engine, [("filler", filler, GREEDY), ("req-0", prompts["req-0"], GREEDY)])
    head = chain_hashes(engine.hash_seed, prompts["req-0"][:32], 16)
    assert pools.pools[1].cached_prefix_blocks(head) == 2
    assert pools.pools[0].cached_prefix_blocks(head) == 0
    rest = {rid: prompts[rid] for rid in ("req-1", "req-2")}
    tokens, cached = one_by_one(engine, rest, GREEDY)
    assert min(cached.values()) >= 32
    assert tokens == {rid: expected[rid] for rid in rest}
    assert pools.pools[0].cached_prefix_blocks(head) == 0  # served where the head was


def test_bytes_sent_per_decode_step_match_the_analytic_count(dp2: ShardedCausalLM) -> None:
    config = dp2.config
    stride = dp2.attention_pool_stride
    cache = PagedLatentCache(dp2.num_cache_layers, 8, 16, config.latent_dim, dp2.dtype, "cpu")
    prompts = [[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]]
    tables = [[0, 1], [stride + 2, stride + 3]]  # one sequence on each rank
    dp2(ForwardBatch.build(prompts, [0, 0], tables, 16), cache)
    before = dp2.group.bytes_sent
    counted = dp2.rank_counters()
    start = dp2.group.bytes_sent
    decode = ForwardBatch.build([[13], [14]], [5, 5], tables, 16)
    dp2.forward_with_logits(decode, cache, decode.last_token_indices())
    sent = dp2.group.bytes_sent - start
    # each rank's attention read its one sequence's 6 latent rows per decoder layer, fp32
    per_rank = 6 * config.latent_dim * 4 * config.num_hidden_layers
    after = dp2.rank_counters()
    read = [a.latent_bytes_read - b.latent_bytes_read for a, b in zip(after, counted, strict=True)]
    assert read == [per_rank, per_rank]
    assert before <= counted[0].bytes_sent
    expected = decode_step_bytes(
        config, 2, expert_parallel=False, num_seqs=2, dtype=torch.float32, context_len=6,
        block_size=3,  # two blocks per table, as given
        attention_seqs=1,  # the busiest rank's
    )  # fmt: skip
    assert sent == expected.total
    # each attention's rows join by an all-gather of one row a rank: half the all-reduce's bytes
    row = config.hidden_size * 4
    assert expected.all_gather == config.num_hidden_layers * row
    reduced = decode_step_bytes(
        config, 2, expert_parallel=False, num_seqs=2, dtype=torch.float32, context_len=6,
        block_size=3,
    )  # fmt: skip
    assert reduced.total - expected.total == config.num_hidden_layers * row


def test_four_ranks_expert_parallel_greedy_equals_one_device(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM
) -> None:
    prompts = random_prompts(5, 8, 50, seed=31)
    settings = {"expert_parallel": True, **DP}
    model, cluster = start_parallel_model(tiny_dir, parallel_config(4, **settings))
    try:
        for report in cluster.reports:  # the attention whole on every rank, as counted
            layout = Layout(report.rank, 4, True, data_parallel_attention=True)
            counted = rank_weight_bytes(tiny_model.config, layout, dtype=torch.float32)
            assert report.weight_bytes == counted
        assert_greedy_as_one_device(
            tiny_model, model, tiny_dir, prompts, PLAIN, (CHUNKED, SPECULATIVE), world=4,
            **settings,
        )  # fmt: skip
        # more ranks than sequences: some ranks attend to nothing and still join each step
        two = {rid: prompts[rid] for rid in ("req-0", "req-1")}
        assert_greedy_as_one_device(
            tiny_model, model, tiny_dir, two, PLAIN, (PLAIN,), world=4, **settings
        )
    finally:
        model.close()
