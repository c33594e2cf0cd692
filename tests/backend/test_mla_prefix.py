"""Prefill over a cached prefix read chunk by chunk from the paged cache equals attention over
the gathered context (the dense reference), and the engine path that uses it stays exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from backend.engine.sampling_params import SamplingParams
from backend.model import mla
from backend.model.mla import attention_expanded
from backend.model.mla_prefix import attend_with_lse, attention_over_prefix, expand_rows
from backend.model.model import DeepseekV3ForCausalLM
from tests.support.engine import make_engine, random_prompts, run_all, tokens_of


def _case(num_cached: int, num_q: int, block_size: int, seed: int) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(seed)
    heads, nope, rope, lora, v = 3, 16, 8, 24, 12
    length = num_cached + num_q
    num_blocks = -(-length // block_size) + 5
    order = torch.randperm(num_blocks, generator=gen).tolist()  # scattered blocks
    table = order[: -(-length // block_size)]
    cache = torch.randn(num_blocks * block_size, lora + rope, generator=gen)
    positions = torch.arange(length)
    slots = torch.tensor(table)[positions // block_size] * block_size + positions % block_size
    context = cache[slots]  # [L, lora + rope] in order
    q_nope = torch.randn(num_q, heads, nope, generator=gen)
    q_pe = torch.randn(num_q, heads, rope, generator=gen)
    kv_b = torch.randn(heads * (nope + v), lora, generator=gen) / lora**0.5
    return q_nope, q_pe, context, cache, table, kv_b, v


@pytest.mark.parametrize(
    ("num_cached", "num_q", "block_size", "chunk_tokens"),
    [(37, 9, 4, 8), (64, 16, 16, 16), (5, 20, 16, 2048), (100, 7, 8, 20), (48, 1, 16, 32)],
)
def test_chunked_prefix_attention_equals_the_dense_reference(
    num_cached: int, num_q: int, block_size: int, chunk_tokens: int
) -> None:
    q_nope, q_pe, context, cache, table, kv_b, v = _case(num_cached, num_q, block_size, seed=3)
    scale = 0.2
    expected = attention_expanded(q_nope, q_pe, context, kv_b, kv_b.shape[1], v, scale)
    got = attention_over_prefix(
        q_nope, q_pe, context[num_cached:], cache, table, num_cached, block_size, kv_b, v,
        scale, chunk_tokens,
    )  # fmt: skip
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_and_plain_attention_agree_with_their_lse(causal: bool) -> None:
    gen = torch.Generator().manual_seed(5)
    query = torch.randn(2, 6, 10, generator=gen)
    rows = torch.randn(2, 6, 14, generator=gen)  # key 10 wide, value 4
    fused = attend_with_lse(query, rows, 10, causal, 0.3, fused=True)
    plain = attend_with_lse(query, rows, 10, causal, 0.3, fused=False)
    scores = query @ rows[:, :, :10].transpose(1, 2) * 0.3
    if causal:
        scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    expected = scores.softmax(-1) @ rows[:, :, 10:]
    for out, lse in (fused, plain):
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse, scores.logsumexp(-1), rtol=1e-5, atol=1e-5)


def test_bf16_chunks_stay_close_to_fp32() -> None:
    q_nope, q_pe, context, cache, table, kv_b, v = _case(200, 30, 16, seed=9)
    expected = attention_expanded(q_nope, q_pe, context, kv_b, kv_b.shape[1], v, 0.2)
    got = attention_over_prefix(
        q_nope.bfloat16(), q_pe.bfloat16(), context[200:].bfloat16(), cache.bfloat16(), table,
        200, 16, kv_b.bfloat16(), v, 0.2, 64,
    )  # fmt: skip
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=0.05, atol=0.05)


def test_a_long_prefix_hit_through_the_engine_equals_the_cold_run(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(args[5])  # the cached tokens it read from the pool
        return attention_over_prefix(*args, **kwargs)

    monkeypatch.setattr(mla, "attention_over_prefix", counted)
    shared = random_prompts(1, 160, 160, seed=31)["req-0"]  # 10 blocks of 16
    suffix = random_prompts(1, 90, 90, seed=32)["req-0"]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    cold = run_all(make_engine(tiny_model, tiny_dir), [("b", shared + suffix, params)])["b"]
    assert not calls
    engine = make_engine(tiny_model, tiny_dir)
    run_all(engine, [("a", shared + [7, 8, 9], params)])
    warm = run_all(engine, [("b", shared + suffix, params)])["b"]
    assert tokens_of(warm) == tokens_of(cold)
    assert warm[-1].num_cached_tokens == 160
    assert calls and set(calls) == {160}


def test_expanded_rows_are_the_same_with_a_gradient_and_carry_it() -> None:
    """Training (the demo's) expands the latents by differentiable ops: the same rows, and a
    gradient reaches kv_b_proj."""
    torch.manual_seed(0)
    heads, nope, v, rank, rope = 3, 8, 6, 16, 4
    latents = torch.randn(5, rank + rope)
    weight = torch.randn(heads * (nope + v), rank, requires_grad=True)
    with torch.no_grad():
        plain = expand_rows(latents, weight, heads, nope, v)
    trained = expand_rows(latents, weight, heads, nope, v)
    torch.testing.assert_close(trained, plain)
    trained.sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0


def test_unfused_attention_in_bounded_query_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.model import mla_prefix

    monkeypatch.setattr(mla_prefix, "_SCORES_BUDGET", 2 * 9)  # 1 query row of 2 heads x 9 keys
    gen = torch.Generator().manual_seed(8)
    query = torch.randn(2, 9, 10, generator=gen)
    rows = torch.randn(2, 9, 16, generator=gen)
    for causal in (False, True):
        blocked = attend_with_lse(query, rows, 10, causal, 0.3, fused=False)
        fused = attend_with_lse(query, rows, 10, causal, 0.3, fused=True)
        torch.testing.assert_close(blocked, fused, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_prefix_attention_on_the_gpu(dtype: torch.dtype) -> None:
    q_nope, q_pe, context, cache, table, kv_b, v = _case(300, 40, 16, seed=11)
    expected = attention_expanded(q_nope, q_pe, context, kv_b, kv_b.shape[1], v, 0.2)
    tensors = [t.to("cuda", dtype) for t in (q_nope, q_pe, context[300:], cache, kv_b)]
    q_nope, q_pe, own, cache, kv_b = tensors
    got = attention_over_prefix(q_nope, q_pe, own, cache, table, 300, 16, kv_b, v, 0.2, 128)
    tolerance = 1e-4 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(got.float().cpu(), expected, rtol=tolerance, atol=tolerance)
