"""noaux_tc routing against a direct, loop-by-loop transcription of its five steps."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from backend.model.config import MoEConfig
from backend.model.moe import route_noaux_tc


def _moe(n_group: int = 4, topk_group: int = 2, k: int = 3, norm: bool = True) -> MoEConfig:
    return MoEConfig(
        n_routed_experts=16,
        n_shared_experts=1,
        num_experts_per_tok=k,
        moe_intermediate_size=8,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=2.5,
        norm_topk_prob=norm,
        first_k_dense_replace=0,
    )


def reference_route(
    logits: list[float], bias: list[float], moe: MoEConfig, dropped_fill: float = -math.inf
) -> tuple[list[float], list[int]]:
    """One token, step by step; ties go to the lower index. ``dropped_fill`` 0.0 mimics old HF."""
    scores = [1.0 / (1.0 + math.exp(-value)) for value in logits]  # 1. sigmoid
    biased = [s + b for s, b in zip(scores, bias, strict=True)]  # 2. add the correction bias
    size = moe.experts_per_group  # 3. groups by the sum of their top-2 biased scores
    group_scores = [sum(sorted(biased[g * size : (g + 1) * size])[-2:]) for g in range(moe.n_group)]
    kept = sorted(range(moe.n_group), key=lambda g: (-group_scores[g], g))[: moe.topk_group]
    masked = [b if e // size in kept else dropped_fill for e, b in enumerate(biased)]
    chosen = sorted(range(len(masked)), key=lambda e: (-masked[e], e))[: moe.num_experts_per_tok]
    weights = [scores[e] for e in chosen]  # 5. unbiased scores, normalized, scaled
    if moe.norm_topk_prob:
        total = sum(weights)
        weights = [w / total for w in weights]
    return [w * moe.routed_scaling_factor for w in weights], chosen  # 4. chosen above


def _check(logits: torch.Tensor, bias: torch.Tensor, moe: MoEConfig) -> None:
    weights, ids = route_noaux_tc(logits, bias, moe)
    for row in range(logits.shape[0]):
        ref_weights, ref_ids = reference_route(logits[row].tolist(), bias.tolist(), moe)
        assert ids[row].tolist() == ref_ids
        torch.testing.assert_close(weights[row], torch.tensor(ref_weights), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "moe", [_moe(), _moe(n_group=1, topk_group=1), _moe(norm=False), _moe(8, 3, 4)]
)
def test_random_logits_match_reference(moe: MoEConfig) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 16, generator=generator) * 2
    bias = torch.rand(16, generator=generator) * 0.5
    _check(logits, bias, moe)


def test_ties_go_to_lower_indices() -> None:
    moe = _moe()
    logits = torch.zeros(2, 16)
    _check(logits, torch.zeros(16), moe)
    _, ids = route_noaux_tc(logits, torch.zeros(16), moe)
    assert ids[0].tolist() == [0, 1, 2]  # groups 0 and 1 kept, lowest experts first


def test_negative_biased_scores_need_minus_inf_mask() -> None:
    # Every biased score is negative. Group 3 is strongest, then group 2; experts of dropped
    # groups 0 and 1 must never be chosen. A 0.0 fill (HF transformers before 5.x) makes them
    # beat every kept expert.
    moe = _moe(k=3)
    logits = torch.tensor([[-1.0] * 8 + [0.5, 0.4, 0.3, 0.2, 1.0, 0.9, 0.8, 0.7]])
    bias = torch.full((16,), -2.0)
    _check(logits, bias, moe)
    _, ids = route_noaux_tc(logits, bias, moe)
    assert all(e >= 8 for e in ids[0].tolist())
    _, zero_fill_ids = reference_route(logits[0].tolist(), bias.tolist(), moe, dropped_fill=0.0)
    assert all(e < 8 for e in zero_fill_ids)
    # Installed HF (5.x) masks with -inf too: same experts as ours.
    hf_config = DeepseekV3Config(
        hidden_size=16, n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2
    )
    router = DeepseekV3TopkRouter(hf_config)
    with torch.no_grad():
        router.weight.copy_(torch.eye(16))
        router.e_score_correction_bias.copy_(bias)
    _, hf_weights, hf_ids = router(logits)
    assert sorted(hf_ids[0].tolist()) == sorted(ids[0].tolist())
