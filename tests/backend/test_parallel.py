"""The parallel engine on CPU with gloo: 2 and 4 ranks (worker ranks are processes the engine
starts) give the single-process engine's greedy tokens over batched, chunked-prefill,
prefix-cached and speculative runs; logits agree within LOGITS_ATOL (fp32; the all-reduces add
the partial sums in another order than one device); FP8 slices (block-aligned ones kept FP8,
others dequantized) and a checkpoint written by HF transformers load and agree too."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from backend.demo_checkpoint import demo_config, write_demo_checkpoint
from backend.engine.sampling_params import SamplingParams
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.checkpoint import load_model
from backend.model.fp8_linear import FP8Linear
from backend.model.model import DeepseekV3ForCausalLM
from backend.parallel.cluster import start_parallel_model
from backend.parallel.layout import Layout
from backend.parallel.model import MTP, MTP_NEXT, ShardedCausalLM, decode_plan, encode_plan
from backend.parallel.sizing import decode_step_bytes, rank_weight_bytes
from tests.support.engine import GREEDY, engine_config, make_engine, random_prompts
from tests.support.parallel import (
    assert_greedy_as_one_device,
    assert_logits_close,
    assert_prefix_hits_as_one_device,
    greedy_tokens,
    logits_by_step,
    parallel_config,
    prefix_prompts,
    worker_pids,
)
from tests.support.statistics import chi2_quantile

pytestmark = pytest.mark.slow

LOGITS_ATOL = 1e-4  # fp32 logits of the tiny models are O(1); reduction order moves them ~1e-6

CPU = torch.device("cpu")
PLAIN = {"spec_enabled": False}
CHUNKED = {"spec_enabled": False, "max_batch_tokens": 32}
SPECULATIVE = {"spec_enabled": True, "spec_num_tokens": 2, "spec_max_batch_size": None}


@pytest.fixture(scope="module")
def tp2(tiny_dir: Path) -> Iterator[ShardedCausalLM]:
    model, _ = start_parallel_model(tiny_dir, parallel_config(2))
    yield model
    model.close()


def test_plan_round_trips() -> None:
    batch = ForwardBatch.build([[5, 6, 7], [8]], [0, 20], [[3, 4], [1, 9]], 16)
    back = decode_plan(encode_plan(batch))
    assert back.input_ids.tolist() == [5, 6, 7, 8]
    assert back.positions.tolist() == batch.positions.tolist()
    assert back.slot_mapping.tolist() == batch.slot_mapping.tolist()
    assert (back.seq_lens_q, back.context_lens) == (batch.seq_lens_q, batch.context_lens)
    assert back.block_tables == [[3, 4], [1, 9]]


def test_two_ranks_greedy_equals_one_device(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM, tp2: ShardedCausalLM
) -> None:
    prompts = random_prompts(6, 10, 70, seed=11)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    runs = (PLAIN, CHUNKED, SPECULATIVE)
    assert_greedy_as_one_device(
        tiny_model, tp2, tiny_dir, prompts, PLAIN, runs, world=2, params=params
    )


def test_ranks_run_over_gloo_on_cpu_each_told_its_local_rank(tp2: ShardedCausalLM) -> None:
    assert (tp2.group.backend, tp2.group.device, tp2.device) == ("gloo", CPU, CPU)
    (pid,) = worker_pids().values()
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--local-rank") + 1] == "1"  # its GPU on a CUDA node


def test_two_ranks_prefix_cache_hits_give_the_same_tokens(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM, tp2: ShardedCausalLM
) -> None:
    prompts = prefix_prompts(seed=21)
    assert_prefix_hits_as_one_device(tiny_model, tp2, tiny_dir, prompts, PLAIN, CHUNKED)


def test_two_ranks_logits_within_tolerance(
    tiny_model: DeepseekV3ForCausalLM, tp2: ShardedCausalLM
) -> None:
    prompt = random_prompts(1, 37, 37, seed=5)["req-0"]
    assert_logits_close(tp2, tiny_model, prompt, 17, LOGITS_ATOL)


def test_four_ranks_expert_parallel_greedy_equals_one_device(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM
) -> None:
    prompts = random_prompts(5, 8, 50, seed=31)
    model, cluster = start_parallel_model(tiny_dir, parallel_config(4, expert_parallel=True))
    try:
        assert [r.rank for r in cluster.reports] == [0, 1, 2, 3]
        assert all(r.peak_bytes > r.weight_bytes for r in cluster.reports)
        for report in cluster.reports:  # the loaded shards, as backend.plan counts them
            layout = Layout(report.rank, 4, expert_parallel=True)
            counted = rank_weight_bytes(tiny_model.config, layout, dtype=torch.float32)
            assert report.weight_bytes == counted
        runs = (CHUNKED, SPECULATIVE)
        assert_greedy_as_one_device(
            tiny_model, model, tiny_dir, prompts, PLAIN, runs, world=4, expert_parallel=True
        )
        moe = model.model.layers[1].mlp
        assert len(moe.experts) == 2  # 8 routed experts over 4 ranks
        assert moe.stacked is not None and moe.stacked.w13.shape[0] == 2  # the fused path's
        prompt = random_prompts(1, 29, 29, seed=37)["req-0"]
        assert_logits_close(model, tiny_model, prompt, 9, LOGITS_ATOL)
    finally:
        model.close()


def test_fp8_slices_load_resident_or_dequantized(tmp_path: Path) -> None:
    # widths chosen so kv_b_proj, o_proj and the MLPs split on 128-blocks over 2 ranks (kept
    # FP8 with their scale grids sliced) and q_b_proj (2 x 144 rows) does not (dequantized)
    overrides = {
        "intermediate_size": 512,
        "moe_intermediate_size": 256,
        "qk_nope_head_dim": 64,
        "v_head_dim": 64,
        "vocab_size": 2000,
    }
    model_dir = write_demo_checkpoint(
        tmp_path, "tiny", seed=4, use_fp8=True, overrides=overrides, tokenizer=False
    )
    prompts = {rid: [t % 2000 for t in p] for rid, p in random_prompts(4, 8, 40, seed=41).items()}
    single = greedy_tokens(
        make_engine(load_model(model_dir), model_dir, engine_config(**PLAIN)), prompts, GREEDY
    )
    model, cluster = start_parallel_model(model_dir, parallel_config(2, expert_parallel=True))
    try:
        for report in cluster.reports:
            layout = Layout(report.rank, 2, expert_parallel=True)
            counted = rank_weight_bytes(model.config, layout, dtype=torch.float32)
            assert report.weight_bytes == counted
        attn = model.model.layers[0].self_attn
        assert isinstance(attn.kv_b_proj, FP8Linear) and isinstance(attn.o_proj, FP8Linear)
        assert attn.kv_b_proj.weight_scale_inv.shape == (2, 1)  # rows 256 of 512, one column
        assert not isinstance(attn.q_b_proj, FP8Linear)
        assert isinstance(model.model.layers[0].mlp.down_proj, FP8Linear)
        engine = make_engine(
            model, model_dir, parallel_config(2, expert_parallel=True, **SPECULATIVE)
        )
        assert greedy_tokens(engine, prompts, GREEDY) == single
    finally:
        model.close()


def test_checkpoint_written_by_hf_transformers(tmp_path: Path) -> None:
    from transformers import DeepseekV3Config
    from transformers import DeepseekV3ForCausalLM as HFDeepseekV3

    raw = demo_config("tiny", {"num_nextn_predict_layers": 0, "vocab_size": 1000})
    torch.manual_seed(3)
    HFDeepseekV3(DeepseekV3Config(**raw)).save_pretrained(tmp_path)
    prompts = {rid: [t % 1000 for t in p] for rid, p in random_prompts(4, 8, 40, seed=51).items()}
    single_model = load_model(tmp_path)
    single = greedy_tokens(
        make_engine(single_model, tmp_path, engine_config(**PLAIN)), prompts, GREEDY
    )
    model, _ = start_parallel_model(tmp_path, parallel_config(2))
    try:
        engine = make_engine(model, tmp_path, parallel_config(2, **CHUNKED))
        assert greedy_tokens(engine, prompts, GREEDY) == single
        prompt = prompts["req-0"]
        ours, theirs = logits_by_step(model, prompt, 3), logits_by_step(single_model, prompt, 3)
        for got, want in zip(ours, theirs, strict=True):
            torch.testing.assert_close(got, want, atol=LOGITS_ATOL, rtol=0)
    finally:
        model.close()


def test_bytes_sent_per_decode_step_match_the_analytic_count(tp2: ShardedCausalLM) -> None:
    config = tp2.config
    cache = PagedLatentCache(tp2.num_cache_layers, 8, 16, config.latent_dim, tp2.dtype, "cpu")
    prompts = [[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]]
    tables = [[0, 1], [2, 3]]
    tp2(ForwardBatch.build(prompts, [0, 0], tables, 16), cache)
    before = tp2.group.bytes_sent
    decode = ForwardBatch.build([[13], [14]], [5, 5], tables, 16)
    tp2.forward_with_logits(decode, cache, decode.last_token_indices())  # as the runner does
    sent = tp2.group.bytes_sent - before
    expected = decode_step_bytes(
        config, 2, expert_parallel=False, num_seqs=2, dtype=torch.float32, context_len=6,
        block_size=3,  # two blocks per table, as given
    )  # fmt: skip
    assert sent == expected.total == expected.all_reduce + expected.plan


def test_each_step_sends_its_plan_once(tiny_dir: Path, tp2: ShardedCausalLM) -> None:
    """One command per engine step; with drafting one more, holding the sampled next tokens
    only (the workers keep the step's plan and output)."""
    prompts = random_prompts(3, 5, 20, seed=41)
    one_draft = {**SPECULATIVE, "spec_num_tokens": 1}
    for overrides, per_step in ((PLAIN, 1), (CHUNKED, 1), (one_draft, 2)):
        engine = make_engine(tp2, tiny_dir, parallel_config(2, **overrides))
        for rid, prompt in prompts.items():
            engine.add_request(rid, prompt, GREEDY)
        steps, before = 0, tp2.commands_sent.copy()
        while engine.has_unfinished:
            engine.step()
            steps += 1
        sent = tp2.commands_sent - before
        assert sent.total() == per_step * steps, overrides
        assert sent[MTP_NEXT] == (steps if per_step == 2 else 0) and not sent[MTP], overrides


def test_two_ranks_sample_the_one_device_distribution(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM, tp2: ShardedCausalLM
) -> None:
    """Chi-square goodness of fit of 400 first tokens sampled over 2 ranks (temperature 1.5,
    top-k 4) against the one-device model's exact probabilities. The threshold is the
    chi-square quantile for p = 1e-4: a correct engine fails with probability 1e-4 over the
    draws (fixed here by the seed)."""
    torch.manual_seed(23)
    prompt = random_prompts(1, 12, 12, seed=29)["req-0"]
    params = SamplingParams(temperature=1.5, top_p=1.0, top_k=4, max_tokens=1, ignore_eos=True)
    config = tiny_model.config
    cache = PagedLatentCache(
        tiny_model.num_cache_layers, 1, 16, config.latent_dim, torch.float32, "cpu"
    )
    hidden = tiny_model(ForwardBatch.for_prefill(prompt, 0, [0], 16), cache)
    logits = tiny_model.compute_logits(hidden[-1:])[0]
    top = logits.topk(4)
    probs = (top.values / 1.5).softmax(dim=-1)
    expected = dict(zip(top.indices.tolist(), probs.tolist(), strict=True))
    num_samples = 400
    engine = make_engine(tp2, tiny_dir, parallel_config(2, **PLAIN))
    tokens = greedy_tokens(engine, {f"s{i}": prompt for i in range(num_samples)}, params)
    counts = Counter(t[0] for t in tokens.values())
    assert set(counts) <= set(expected)
    statistic = sum(
        (counts[token] - num_samples * p) ** 2 / (num_samples * p) for token, p in expected.items()
    )
    assert statistic < chi2_quantile(len(expected) - 1, 1e-4), (statistic, counts, expected)


def test_two_ranks_pad_decode_steps_to_buckets_as_one_device(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM
) -> None:
    # decode_graphs "on": rank 0 pads each decode step to its bucket and sends the padded plan;
    # every rank runs it (eagerly: a parallel engine captures nothing), pool padding included
    model, _ = start_parallel_model(tiny_dir, parallel_config(2, decode_graphs="on", **PLAIN))
    try:
        prompts = random_prompts(3, 10, 40, seed=13)  # batch 3: bucket 4, one padding sequence
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        reference = make_engine(tiny_model, tiny_dir, engine_config(**PLAIN))
        expected = greedy_tokens(reference, prompts, params)
        for overrides in (PLAIN, SPECULATIVE):
            config = parallel_config(2, decode_graphs="on", **overrides)
            engine = make_engine(model, tiny_dir, config)
            assert greedy_tokens(engine, prompts, params) == expected, overrides
            graphs = engine.runner.graphs
            assert graphs is not None and graphs.num_graphs == 0
            assert graphs.num_padded_eager > 0
    finally:
        model.close()
