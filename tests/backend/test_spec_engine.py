"""MTP speculative decoding through the engine: greedy output identical to plain decoding, the
sampled distribution kept, and no block lost whatever happens mid-speculation."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from backend.engine.llm_engine import LLMEngine
from backend.engine.sampler import Sampler, SampleRow
from backend.engine.sampling_params import SamplingParams
from backend.generate import logits_for
from backend.model.model import DeepseekV3ForCausalLM
from tests.support.engine import (
    GREEDY,
    engine_config,
    make_engine,
    random_prompts,
    run_all,
    tokens_of,
)
from tests.support.statistics import chi2_quantile


def spec_config(num_tokens: int, **overrides: Any) -> Any:
    return engine_config(spec_num_tokens=num_tokens, spec_max_batch_size=None, **overrides)


def plain_config(**overrides: Any) -> Any:
    return engine_config(spec_enabled=False, **overrides)


def outputs(
    engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams = GREEDY
) -> dict[str, list[int]]:
    results = run_all(engine, [(r, p, params) for r, p in prompts.items()])
    return {r: tokens_of(o) for r, o in results.items()}


def often_right_drafts(
    engine: LLMEngine, reference: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replace the MTP layer's proposals (it still runs and fills its cache) with the reference
    output, wrong at some positions, so full, partial and no acceptance all happen (a random
    model's MTP layer is almost never right)."""
    runner = engine.runner
    propose = runner._draft

    def drafts(*args: Any) -> list[list[int]]:
        out = propose(*args)
        scheduled, emitted = args[2], args[3]
        for i, item in enumerate(scheduled):
            done = len(item.seq.output_token_ids) + len(emitted[i])
            ref = reference[item.seq.request_id]
            out[i] = [
                ref[n] if n < len(ref) and (5 * n + 1) % 7 >= 2 else 5
                for n in range(done, done + len(out[i]))
            ]
        return out

    monkeypatch.setattr(runner, "_draft", drafts)


def assert_no_block_held(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert not engine.runner._draft_probs and not engine.runner._generators


@pytest.mark.parametrize("num_tokens", [1, 2, 3])
def test_greedy_speculation_equals_plain_decoding(
    tiny_model: DeepseekV3ForCausalLM,
    tiny_dir: Path,
    num_tokens: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompts = random_prompts(3, 3, 40, seed=11)
    params = replace(GREEDY, max_tokens=12)
    reference = outputs(make_engine(tiny_model, tiny_dir, plain_config()), prompts, params)
    engine = make_engine(tiny_model, tiny_dir, spec_config(num_tokens))
    together = outputs(engine, prompts, params)
    alone = {r: outputs(engine, {r: p}, params)[r] for r, p in prompts.items()}
    assert together == reference == alone
    stats = engine.stats()
    assert stats.spec_num_tokens == num_tokens
    assert stats.spec_verified_tokens_total > 0 and stats.spec_draft_steps_total > 0
    assert stats.spec_accepted_tokens_total <= stats.spec_verified_tokens_total
    assert_no_block_held(engine)
    oracle = make_engine(tiny_model, tiny_dir, spec_config(num_tokens))
    often_right_drafts(oracle, reference, monkeypatch)
    assert outputs(oracle, prompts, params) == reference
    stats = oracle.stats()
    assert 0 < stats.spec_accepted_tokens_total < stats.spec_verified_tokens_total
    assert_no_block_held(oracle)


def test_speculation_with_chunked_prefill_preemption_and_prefix_hits(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = random_prompts(1, 40, 40, seed=12)["req-0"]
    prompts = {f"p{i}": shared + p for i, p in random_prompts(4, 5, 30, seed=13).items()}
    params = replace(GREEDY, max_tokens=20)
    reference = outputs(make_engine(tiny_model, tiny_dir, plain_config()), prompts, params)
    block_bytes = 16 * tiny_model.num_cache_layers * tiny_model.config.latent_dim * 4
    tight = spec_config(2, max_batch_tokens=37, max_num_seqs=6, cache_memory_bytes=14 * block_bytes)
    engine = make_engine(tiny_model, tiny_dir, tight)
    often_right_drafts(engine, reference, monkeypatch)
    assert outputs(engine, prompts, params) == reference
    stats = engine.stats()
    assert stats.num_preemptions_total > 0
    assert stats.prefix_cache_hit_tokens_total > 0
    assert stats.spec_accepted_tokens_total > 0
    assert_no_block_held(engine)


def test_aborts_during_speculation_leak_nothing(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    """Hundreds of requests, a random few aborted after every step, some preempted: every
    block comes back and the survivors still match plain greedy decoding."""
    rng = random.Random(14)
    prompts = random_prompts(340, 2, 20, seed=15)
    block_bytes = 16 * tiny_model.num_cache_layers * tiny_model.config.latent_dim * 4
    config = spec_config(3, max_num_seqs=12, cache_memory_bytes=30 * block_bytes)
    engine = make_engine(tiny_model, tiny_dir, config)
    params = {r: replace(GREEDY, max_tokens=rng.randint(1, 8)) for r in prompts}
    pending = list(prompts)
    produced: dict[str, list[int]] = {r: [] for r in prompts}
    aborted: set[str] = set()
    while pending or engine.has_unfinished:
        for _ in range(min(len(pending), rng.randint(0, 6))):
            request_id = pending.pop(0)
            engine.add_request(request_id, prompts[request_id], params[request_id])
        for output in engine.step():
            produced[output.request_id].extend(output.new_token_ids)
        live = list(engine._requests)
        for request_id in rng.sample(live, k=min(len(live), rng.randint(1, 3))):
            assert engine.abort(request_id) is not None
            aborted.add(request_id)
        held = {b for s in engine.scheduler.running for b in s.block_table}
        assert engine.block_manager.num_used_blocks == len(held)
    assert len(aborted) >= 200
    assert engine.stats().spec_verified_tokens_total > 0
    assert_no_block_held(engine)
    survivors = {r: prompts[r] for r in rng.sample(sorted(set(prompts) - aborted), 4)}
    plain = make_engine(tiny_model, tiny_dir, plain_config())
    for request_id, prompt in survivors.items():
        expected = outputs(plain, {request_id: prompt}, params[request_id])[request_id]
        assert produced[request_id] == expected


def test_speculation_pauses_above_its_batch_threshold(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    prompts = random_prompts(4, 3, 10, seed=16)
    engine = make_engine(
        tiny_model, tiny_dir, engine_config(spec_num_tokens=1, spec_max_batch_size=3)
    )
    outputs(engine, prompts)
    assert engine.stats().spec_draft_steps_total == 0
    outputs(engine, dict(list(prompts.items())[:3]))
    assert engine.stats().spec_draft_steps_total > 0
    off = make_engine(tiny_model, tiny_dir, plain_config())
    outputs(off, {"a": prompts["req-0"]})
    assert off.stats().spec_num_tokens == 0 and off.stats().spec_draft_steps_total == 0


def test_seeded_samples_do_not_depend_on_the_batch(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    prompts = random_prompts(5, 3, 20, seed=17)
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=5, max_tokens=12, ignore_eos=True)
    engine = make_engine(tiny_model, tiny_dir, spec_config(2))
    together = outputs(engine, prompts, params)
    alone = {r: outputs(engine, {r: p}, params)[r] for r, p in prompts.items()}
    plain = outputs(make_engine(tiny_model, tiny_dir, plain_config()), prompts, params)
    assert together == alone == plain


def _target_pairs(
    model: DeepseekV3ForCausalLM, prompt: list[int], params: SamplingParams
) -> tuple[dict[tuple[int, int], float], dict[int, torch.Tensor]]:
    """Exact probability of each (first, second) output token pair under `params`, and the
    distribution of the second token after each first one."""
    sampler = Sampler()
    row = SampleRow(params, (), (), None)
    first = sampler.probs(logits_for(model, prompt)[-1:], [row])[0]
    pairs: dict[tuple[int, int], float] = {}
    seconds: dict[int, torch.Tensor] = {}
    for a in first.nonzero().flatten().tolist():
        seconds[a] = sampler.probs(logits_for(model, [*prompt, a])[-1:], [row])[0]
        for b in seconds[a].nonzero().flatten().tolist():
            pairs[(a, b)] = float(first[a] * seconds[a][b])
    return pairs, seconds


def overlapping_drafts(
    engine: LLMEngine, seconds: dict[int, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Draft the second token from q: half uniform over the target's support there, half on
    one token outside it (so p > q, p < q and q > 0 = p all occur); q goes to the verifier."""
    runner = engine.runner
    propose = runner._draft

    def drafts(*args: Any) -> list[list[int]]:
        out = propose(*args)
        scheduled, emitted = args[2], args[3]
        for i, item in enumerate(scheduled):
            if item.seq.output_token_ids or not out[i]:
                continue  # only the drafts proposed with the first token
            target = seconds[emitted[i][0]]
            q = (target > 0).float() / int((target > 0).sum()) * 0.5
            q[int(target.argmin())] += 0.5
            out[i] = [int(torch.multinomial(q, 1)[0])]
            runner._draft_probs[item.seq.request_id] = q[None]
        return out

    monkeypatch.setattr(runner, "_draft", drafts)


@pytest.mark.timeout(300)  # a few hundred full-vocabulary samples: slow on a shared CPU
@pytest.mark.parametrize("drafter", ["mtp", "overlapping"])
def test_sampled_speculation_keeps_the_target_distribution(
    tiny_model: DeepseekV3ForCausalLM,
    tiny_dir: Path,
    drafter: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chi-square goodness of fit of the first two sampled tokens (top-k 3: at most 9 pairs;
    the second token always goes through draft verification) against the target model's exact
    pair probabilities, with the MTP layer's own drafts (a random model's: nearly always
    rejected, so the residual distribution is exercised) and with drafts that overlap the
    target. The threshold is the chi-square quantile for p = 1e-4: a correct engine fails
    with probability 1e-4 over the random draws (fixed here by the seed)."""
    torch.manual_seed(18)
    prompt = random_prompts(1, 12, 12, seed=19)["req-0"]
    params = SamplingParams(temperature=1.5, top_p=1.0, top_k=3, max_tokens=3, ignore_eos=True)
    expected, seconds = _target_pairs(tiny_model, prompt, params)
    num_samples, batch_size = 400, 100
    engine = make_engine(tiny_model, tiny_dir, spec_config(1, max_num_seqs=batch_size))
    if drafter == "overlapping":
        overlapping_drafts(engine, seconds, monkeypatch)
    counts: Counter[tuple[int, int]] = Counter()
    for start in range(0, num_samples, batch_size):
        batch = {f"s{start + i}": prompt for i in range(batch_size)}
        for tokens in outputs(engine, batch, params).values():
            counts[(tokens[0], tokens[1])] += 1
    stats = engine.stats()
    assert stats.spec_verified_tokens_total == num_samples
    if drafter == "overlapping":
        assert 0 < stats.spec_accepted_tokens_total < stats.spec_verified_tokens_total
    assert set(counts) <= set(expected)
    statistic = sum(
        (counts[pair] - num_samples * p) ** 2 / (num_samples * p) for pair, p in expected.items()
    )
    assert statistic < chi2_quantile(len(expected) - 1, 1e-4), (statistic, counts, expected)
