"""LLMEngine end to end on a tiny fp32 checkpoint: the engine invariants of ENGINE-NOTES."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from backend.engine.blocks import BlockEvent, BlockEvicted
from backend.engine.llm_engine import LLMEngine, PromptTooLong
from backend.engine.sampler import SampleRow, apply_penalties
from backend.engine.sampling_params import SamplingParams
from backend.generate import logits_for
from backend.model.checkpoint import load_generation_config
from backend.model.model import DeepseekV3ForCausalLM
from tests.support.engine import (
    GREEDY,
    HASH_SEED,
    engine_config,
    make_engine,
    random_prompts,
    run_all,
    tokens_of,
)


def _greedy_tokens(
    engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams = GREEDY
) -> dict[str, list[int]]:
    outputs = run_all(engine, ((rid, prompt, params) for rid, prompt in prompts.items()))
    return {rid: tokens_of(outs) for rid, outs in outputs.items()}


def test_greedy_matches_hf_transformers(tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path) -> None:
    from transformers import DeepseekV3ForCausalLM as HFDeepseekV3  # slow import: only here

    reference = HFDeepseekV3.from_pretrained(tiny_dir, dtype=torch.float32)
    prompts = random_prompts(4, 5, 40, seed=1)
    got = _greedy_tokens(make_engine(tiny_model, tiny_dir), prompts)
    for rid, prompt in prompts.items():
        out = reference.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=GREEDY.max_tokens,
            min_new_tokens=GREEDY.max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        assert got[rid] == out[0, len(prompt) :].tolist(), rid


@pytest.mark.parametrize(
    "params",
    [
        GREEDY,
        # few tokens: top-p sorts the whole vocabulary per row, slow on one CPU thread
        SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=3, ignore_eos=True),
    ],
    ids=["greedy", "seeded"],
)
def test_outputs_do_not_depend_on_batch_or_order(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path, params: SamplingParams
) -> None:
    prompts = random_prompts(16, 3, 70, seed=2)
    together = _greedy_tokens(make_engine(tiny_model, tiny_dir), prompts, params)
    order = list(prompts)
    random.Random(3).shuffle(order)
    shuffled = _greedy_tokens(
        make_engine(tiny_model, tiny_dir), {r: prompts[r] for r in order}, params
    )
    engine = make_engine(tiny_model, tiny_dir)
    alone = {r: _greedy_tokens(engine, {r: p}, params)[r] for r, p in prompts.items()}
    assert together == alone
    assert shuffled == alone
    assert len({tuple(tokens) for tokens in alone.values()}) > len(prompts) // 2  # not trivial


@pytest.mark.parametrize("max_batch_tokens", [16, 23, 61])
def test_chunked_prefill_equals_one_shot(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path, max_batch_tokens: int
) -> None:
    prompts = random_prompts(5, 30, 120, seed=4)
    one_shot = engine_config(chunked_prefill=False, max_num_seqs=4, max_batch_tokens=512)
    chunked = engine_config(max_num_seqs=4, max_batch_tokens=max_batch_tokens)
    reference = _greedy_tokens(make_engine(tiny_model, tiny_dir, one_shot), prompts)
    engine = make_engine(tiny_model, tiny_dir, chunked)
    assert _greedy_tokens(engine, prompts) == reference
    assert engine.stats().num_steps_total > sum(map(len, prompts.values())) // max_batch_tokens


def test_preempted_requests_recompute_the_same_tokens(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    prompts = random_prompts(6, 30, 50, seed=5)
    params = replace(GREEDY, max_tokens=30)
    reference = _greedy_tokens(make_engine(tiny_model, tiny_dir), prompts, params)
    block_bytes = 16 * tiny_model.num_cache_layers * tiny_model.config.latent_dim * 4
    tiny_pool = engine_config(max_batch_tokens=64, cache_memory_bytes=12 * block_bytes)
    engine = make_engine(tiny_model, tiny_dir, tiny_pool)
    assert engine.runner.num_blocks == 12
    assert _greedy_tokens(engine, prompts, params) == reference
    stats = engine.stats()
    assert stats.num_preemptions_total > 0
    assert stats.num_free_blocks == stats.num_total_blocks == 12


def test_prefix_cache_hit_equals_cold_run(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    shared = random_prompts(1, 70, 70, seed=6)["req-0"]  # 4 full blocks of 16 and 6 more
    first, second = shared + [11, 12, 13], shared + [21, 22]
    cold = _greedy_tokens(make_engine(tiny_model, tiny_dir), {"b": second})["b"]
    engine = make_engine(tiny_model, tiny_dir)
    first_out = run_all(engine, [("a", first, GREEDY)])["a"]
    assert first_out[-1].num_cached_tokens == 0
    second_out = run_all(engine, [("b", second, GREEDY)])["b"]
    assert tokens_of(second_out) == cold
    assert {o.num_cached_tokens for o in second_out} == {64}
    stats = engine.stats()
    assert stats.prefix_cache_hit_tokens_total == 64
    assert stats.prefix_cache_query_tokens_total == len(first) + len(second)


def test_the_last_prompt_token_is_always_computed(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    prompt = random_prompts(1, 48, 48, seed=7)["req-0"]  # exactly 3 blocks
    engine = make_engine(tiny_model, tiny_dir)
    first = tokens_of(run_all(engine, [("a", prompt, GREEDY)])["a"])
    again = run_all(engine, [("b", prompt, GREEDY)])["b"]
    assert tokens_of(again) == first
    assert again[0].num_cached_tokens == 32


def test_eviction_under_memory_pressure_keeps_results_correct(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    base = random_prompts(8, 40, 60, seed=8)
    prompts = {"req-0": base["req-0"], "req-1": base["req-1"], "hot": base["req-1"] + [7]}
    prompts.update((rid, p) for rid, p in base.items() if rid not in prompts)
    prompts["evicted"] = base["req-0"][:32] + [33, 44, 55]  # its prefix is gone by now
    cold = {
        rid: _greedy_tokens(make_engine(tiny_model, tiny_dir), {rid: p})[rid]
        for rid, p in prompts.items()
    }
    evictions: list[BlockEvent] = []
    block_bytes = 16 * tiny_model.num_cache_layers * tiny_model.config.latent_dim * 4
    engine = LLMEngine(
        tiny_model,
        engine_config(cache_memory_bytes=10 * block_bytes, max_batch_tokens=64),
        hash_seed=HASH_SEED,
        generation_defaults=load_generation_config(tiny_dir),
        on_block_event=lambda e: evictions.append(e) if isinstance(e, BlockEvicted) else None,
    )
    cached: dict[str, int] = {}
    for rid, prompt in prompts.items():
        outputs = run_all(engine, [(rid, prompt, GREEDY)])[rid]
        assert tokens_of(outputs) == cold[rid], rid
        cached[rid] = outputs[-1].num_cached_tokens
    assert cached["hot"] == len(base["req-1"]) // 16 * 16
    assert cached["evicted"] == 0
    assert evictions
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_finish_reasons_stop_length_and_abort(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    prompt = random_prompts(1, 10, 10, seed=9)["req-0"]
    engine = make_engine(tiny_model, tiny_dir)
    free_tokens = _greedy_tokens(engine, {"free": prompt})["free"]
    stop_at = free_tokens[3]
    if stop_at in free_tokens[:3]:
        pytest.fail("pick a prompt whose 4th greedy token is new")
    stopped = run_all(engine, [("s", prompt, replace(GREEDY, stop_token_ids=(stop_at,)))])["s"]
    assert tokens_of(stopped) == free_tokens[:4]
    assert [o.finish_reason for o in stopped] == [None, None, None, "stop"]
    assert stopped[-1].finished and not any(o.finished for o in stopped[:-1])
    length = run_all(engine, [("l", prompt, replace(GREEDY, max_tokens=2))])["l"]
    assert length[-1].finish_reason == "length" and tokens_of(length) == free_tokens[:2]
    engine.add_request("x", prompt, GREEDY)
    engine.step()
    aborted = engine.abort("x")
    assert aborted is not None and aborted.finished and aborted.finish_reason == "abort"
    assert aborted.new_token_ids == []
    assert engine.abort("x") is None
    assert not engine.has_unfinished
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_penalties_see_each_rows_history(tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path) -> None:
    prompts = random_prompts(3, 5, 20, seed=10)
    params = replace(GREEDY, repetition_penalty=3.0, frequency_penalty=1.5, max_tokens=6)
    got = _greedy_tokens(make_engine(tiny_model, tiny_dir), prompts, params)
    for rid, prompt in prompts.items():
        out = got[rid]
        for k, token in enumerate(out):
            logits = logits_for(tiny_model, prompt + out[:k])[-1:]
            row = SampleRow(params, prompt, out[:k], None)
            assert int(apply_penalties(logits, [row]).argmax()) == token, (rid, k)


def test_logprobs_come_with_each_token(tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path) -> None:
    prompt = random_prompts(1, 12, 12, seed=11)["req-0"]
    params = replace(GREEDY, logprobs=True, top_logprobs=3, max_tokens=4)
    outputs = run_all(make_engine(tiny_model, tiny_dir), [("p", prompt, params)])["p"]
    tokens = tokens_of(outputs)
    for k, output in enumerate(outputs):
        assert output.logprobs is not None
        assert len(output.logprobs) == len(output.new_token_ids) == 1
        expected = logits_for(tiny_model, prompt + tokens[:k])[-1].log_softmax(-1)
        entry = output.logprobs[0]
        assert entry.logprob == pytest.approx(float(expected.max()), abs=1e-4)
        assert [token for token, _ in entry.top][0] == output.new_token_ids[0]
        assert len(entry.top) == 3
    plain = run_all(make_engine(tiny_model, tiny_dir), [("q", prompt, GREEDY)])["q"]
    assert all(o.logprobs is None for o in plain)


def test_unset_sampling_fields_take_the_checkpoint_defaults(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_model, tiny_dir)
    engine.add_request("d", [5, 6, 7], SamplingParams(max_tokens=1))
    seq = engine.scheduler.waiting[0]
    assert (seq.params.temperature, seq.params.top_p) == (0.6, 0.95)


def test_prompts_are_checked(tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path) -> None:
    engine = make_engine(tiny_model, tiny_dir, engine_config(max_model_len=50))
    with pytest.raises(PromptTooLong, match="at most 50 tokens"):
        engine.add_request("long", list(range(2, 52)), GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request("oov", [3, 1_000_000], GREEDY)
    with pytest.raises(ValueError, match="no tokens"):
        engine.add_request("empty", [], GREEDY)
    engine.add_request("ok", list(range(2, 51)), GREEDY)  # 49 tokens leave room for one
    with pytest.raises(ValueError, match="duplicate"):
        engine.add_request("ok", [4], GREEDY)
    outputs = [output for _ in range(3) for output in engine.step()]
    assert [(len(o.new_token_ids), o.finish_reason) for o in outputs] == [(1, "length")]
