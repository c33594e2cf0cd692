"""MLA: absorbed decode equals expanded attention; YaRN and the softmax scale are computed right."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from transformers import DeepseekV3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from backend.demo_checkpoint import demo_config
from backend.generate import logits_for, new_cache
from backend.model import mla
from backend.model.cache import ForwardBatch
from backend.model.config import ModelConfig, RopeConfig
from backend.model.mla import (
    absorbed_is_cheaper,
    attention_absorbed,
    attention_absorbed_chunk,
    attention_expanded,
)
from backend.model.model import DeepseekV3ForCausalLM
from backend.model.rope import apply_rotary, correction_range, inv_frequencies
from tests.support.plan import V31

REAL_V31 = {**demo_config("tiny"), **V31}  # the real sizes over the demo's other fields


def test_real_model_derived_facts() -> None:
    config = ModelConfig.from_dict(REAL_V31)
    assert config.softmax_scale == pytest.approx(0.135234, abs=1e-6)
    assert config.cache_bytes_per_token(torch.bfloat16) == 70272
    assert correction_range(config.rope, 64) == (10, 23)
    assert config.moe_layer_indices == list(range(3, 61))


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_yarn_frequencies_match_hf(preset: str) -> None:
    raw = demo_config(preset)
    ours = inv_frequencies(ModelConfig.from_dict(raw).rope, raw["qk_rope_head_dim"])
    hf_config = DeepseekV3Config(
        **{k: v for k, v in raw.items() if k != "rope_scaling"},
        rope_parameters={
            **raw["rope_scaling"],
            "rope_type": "yarn",
            "rope_theta": raw["rope_theta"],
        },
    )
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    assert attention_factor == pytest.approx(1.0)
    # The ramp is active: some frequencies kept, some divided by factor, some blended.
    base = inv_frequencies(RopeConfig(theta=float(raw["rope_theta"])), raw["qk_rope_head_dim"])
    ratio = base / ours
    factor = raw["rope_scaling"]["factor"]
    assert ratio[0] == pytest.approx(1.0)
    assert ratio[-1] == pytest.approx(factor)
    assert ((ratio > 1.01) & (ratio < factor - 0.01)).any()


def test_rotary_rotates_adjacent_pairs() -> None:
    x = torch.tensor([[1.0, 0.0, 0.0, 2.0]])
    angle = math.pi / 2
    cos = torch.tensor([[math.cos(angle), 1.0]])
    sin = torch.tensor([[math.sin(angle), 0.0]])
    torch.testing.assert_close(apply_rotary(x, cos, sin), torch.tensor([[0.0, 1.0, 0.0, 2.0]]))


def test_absorbed_equals_expanded_kernels() -> None:
    generator = torch.Generator().manual_seed(0)
    heads, nope, rope, rank, v_dim, length = 4, 16, 8, 32, 16, 37

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float32)

    q_nope, q_pe = rand(1, heads, nope), rand(1, heads, rope)
    latents, kv_b = rand(length, rank + rope), rand(heads * (nope + v_dim), rank) / 6
    expanded = attention_expanded(q_nope, q_pe, latents, kv_b, rank, v_dim, 0.1)
    per_head = kv_b.view(heads, nope + v_dim, rank)
    valid = torch.ones(1, length, dtype=torch.bool)
    absorbed = attention_absorbed(
        q_nope, q_pe, latents[None], valid, per_head[:, :nope], per_head[:, nope:], 0.1
    )
    torch.testing.assert_close(absorbed, expanded, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("num_q", "length"), [(5, 37), (2, 2), (9, 9)])
def test_absorbed_chunk_equals_expanded_kernel(num_q: int, length: int) -> None:
    # A chunk of num_q new tokens, the last of `length` cached ones (no context when equal).
    generator = torch.Generator().manual_seed(num_q)
    heads, nope, rope, rank, v_dim = 4, 16, 8, 32, 16

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float32)

    q_nope, q_pe = rand(num_q, heads, nope), rand(num_q, heads, rope)
    latents, kv_b = rand(length, rank + rope), rand(heads * (nope + v_dim), rank) / 6
    expanded = attention_expanded(q_nope, q_pe, latents, kv_b, rank, v_dim, 0.1)
    per_head = kv_b.view(heads, nope + v_dim, rank)
    absorbed = attention_absorbed_chunk(
        q_nope, q_pe, latents, per_head[:, :nope], per_head[:, nope:], 0.1
    )
    torch.testing.assert_close(absorbed, expanded, rtol=0, atol=1e-5)


def test_absorbed_cost_rule() -> None:
    real = {"kv_lora_rank": 512, "nope": 128, "rope": 64, "v_head_dim": 128}
    assert absorbed_is_cheaper(2, 4096, **real)  # speculative verify, short chunk tails
    assert absorbed_is_cheaper(160, 100_000, **real)
    assert not absorbed_is_cheaper(180, 100_000, **real)  # crossover near Q = 170
    assert not absorbed_is_cheaper(512, 4096, **real)
    assert not absorbed_is_cheaper(64, 64, **real)  # a cold prefill expands


def test_chunk_over_context_absorbed_equals_expanded(
    tiny_model: DeepseekV3ForCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 6-token chunk after 40 cached tokens takes the absorbed form; forcing the expanded form
    # gives the same logits. (Chunks of at most MAX_SHORT_QUERY tokens take the batched path.)
    tokens = torch.randint(0, 129280, (46,), generator=torch.Generator().manual_seed(3)).tolist()
    dims = tiny_model.config.mla
    assert len(tokens) - 40 > mla.MAX_SHORT_QUERY
    assert absorbed_is_cheaper(
        6, 46, dims.kv_lora_rank, dims.qk_nope_head_dim, dims.qk_rope_head_dim, dims.v_head_dim
    )
    calls: list[int] = []

    def counting(*args: Any) -> torch.Tensor:
        calls.append(1)
        return attention_absorbed_chunk(*args)

    def chunk_logits() -> torch.Tensor:
        cache = new_cache(tiny_model, len(tokens), block_size=8)
        table = list(range(cache.num_blocks))
        tiny_model(ForwardBatch.for_prefill(tokens[:40], 0, table, 8), cache)
        batch = ForwardBatch.for_prefill(tokens[40:], 40, table, 8)
        return tiny_model.compute_logits(tiny_model(batch, cache))

    monkeypatch.setattr(mla, "attention_absorbed_chunk", counting)
    absorbed = chunk_logits()
    assert len(calls) == tiny_model.config.num_hidden_layers  # every layer took the new path
    monkeypatch.setattr(mla, "absorbed_is_cheaper", lambda *args: False)
    expanded = chunk_logits()
    assert len(calls) == tiny_model.config.num_hidden_layers
    error = (absorbed - expanded).abs().max() / expanded.abs().max()
    assert error < 1e-5


def test_short_queries_batched_equal_prefill(tiny_model: DeepseekV3ForCausalLM) -> None:
    # Decodes with 0, 2 and 3 drafts (1, 3 and 4 new tokens) and a long chunk in one step, over
    # scattered blocks: each row's logits == the one-shot prefill's at that position.
    generator = torch.Generator().manual_seed(4)
    lengths, new = [21, 9, 30, 17], [1, 3, 4, 12]
    seqs = [torch.randint(0, 129280, (n,), generator=generator).tolist() for n in lengths]
    block_size = 4
    cache = new_cache(tiny_model, 4 * 32, block_size=block_size)
    order = torch.randperm(cache.num_blocks, generator=generator).tolist()
    tables = [order[i * 8 : (i + 1) * 8] for i in range(4)]
    for tokens, table, q_len in zip(seqs, tables, new, strict=True):
        prefix = tokens[: len(tokens) - q_len]
        tiny_model(ForwardBatch.for_prefill(prefix, 0, table, block_size), cache)
    batch = ForwardBatch.build(
        [t[len(t) - q :] for t, q in zip(seqs, new, strict=True)],
        [len(t) - q for t, q in zip(seqs, new, strict=True)],
        tables,
        block_size,
    )
    logits = tiny_model.compute_logits(tiny_model(batch, cache))
    row = 0
    for tokens, q_len in zip(seqs, new, strict=True):
        reference = logits_for(tiny_model, tokens)[len(tokens) - q_len :]
        error = (logits[row : row + q_len] - reference).abs().max() / reference.abs().max()
        assert error < 1e-5
        row += q_len


def test_decode_steps_equal_full_prefill(tiny_model: DeepseekV3ForCausalLM) -> None:
    # Each absorbed decode step's logits == the expanded prefill's logits at that position.
    tokens = torch.randint(0, 129280, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    reference = logits_for(tiny_model, tokens)
    prompt_len = 8
    cache = new_cache(tiny_model, len(tokens), block_size=4)
    table = list(range(cache.num_blocks))
    batch = ForwardBatch.for_prefill(tokens[:prompt_len], 0, table, 4)
    tiny_model(batch, cache)
    for position in range(prompt_len, len(tokens)):
        batch = ForwardBatch.for_prefill([tokens[position]], position, table, 4)
        assert batch.is_decode
        logits = tiny_model.compute_logits(tiny_model(batch, cache))[0]
        error = (logits - reference[position]).abs().max() / reference[position].abs().max()
        assert error < 1e-5, f"position {position}: relative error {error:.2e}"
