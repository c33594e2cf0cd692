"""DeepSeek-V3 mixture of experts: noaux_tc group-limited routing, routed and shared experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backend.model.config import ModelConfig, MoEConfig
from backend.model.layers import SwiGLU


def route_noaux_tc(logits: Tensor, bias: Tensor, moe: MoEConfig) -> tuple[Tensor, Tensor]:
    """Choose experts per token. logits [T, E] (router output), bias [E].

    Returns (weights [T, k] fp32, expert ids [T, k] long). All in fp32; dropped groups are
    masked to -inf; ties go to the lower index (stable sort), so a token's choice never depends
    on what else is in the batch.
    """
    scores = logits.float().sigmoid()
    biased = scores + bias.float()
    if moe.n_group > 1 and moe.topk_group < moe.n_group:
        grouped = biased.view(-1, moe.n_group, moe.experts_per_group)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, n_group]
        kept = group_scores.sort(dim=-1, descending=True, stable=True).indices[:, : moe.topk_group]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        expert_mask = group_mask.repeat_interleave(moe.experts_per_group, dim=1)
        biased = biased.masked_fill(~expert_mask, float("-inf"))
    ids = biased.sort(dim=-1, descending=True, stable=True).indices[:, : moe.num_experts_per_tok]
    weights = scores.gather(1, ids)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling_factor, ids


class Gate(nn.Module):
    """``mlp.gate``: fp32 weight [E, D] and the noaux_tc score correction bias [E]."""

    e_score_correction_bias: Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.moe = config.moe
        num_experts = config.moe.n_routed_experts
        self.weight = nn.Parameter(torch.empty(num_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:  # x: [T, D]
        logits = F.linear(x.float(), self.weight)
        return route_noaux_tc(logits, self.e_score_correction_bias, self.moe)


class MoE(nn.Module):
    """``mlp``: shared experts on every token plus the weighted routed experts."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        moe = config.moe
        self.top_k = moe.num_experts_per_tok
        self.gate = Gate(config)
        self.experts = nn.ModuleList(
            SwiGLU(config.hidden_size, moe.moe_intermediate_size, dtype)
            for _ in range(moe.n_routed_experts)
        )
        self.shared_experts: SwiGLU | None = None
        if moe.n_shared_experts:
            shared_hidden = moe.moe_intermediate_size * moe.n_shared_experts
            self.shared_experts = SwiGLU(config.hidden_size, shared_hidden, dtype)

    def forward(self, x: Tensor) -> Tensor:  # x: [T, D] -> [T, D]
        weights, ids = self.gate(x)
        out = self.shared_experts(x) if self.shared_experts is not None else torch.zeros_like(x)
        flat_ids = ids.flatten()
        order = flat_ids.argsort(stable=True)  # (token, slot) pairs grouped by expert
        tokens = order // self.top_k
        sorted_weights = weights.flatten()[order, None].to(x.dtype)
        counts = torch.bincount(flat_ids, minlength=len(self.experts)).tolist()
        # Weighted expert outputs in the grouped order [T * k, D], then one index_add_: one
        # call instead of one per expert (cheaper at decode batch sizes), adding in the same
        # expert order on CPU.
        routed = x.new_empty(tokens.shape[0], x.shape[1])
        start = 0
        for expert_id, count in enumerate(counts):
            if not count:
                continue
            end = start + count
            expert_out = self.experts[expert_id](x[tokens[start:end]])
            torch.mul(expert_out, sorted_weights[start:end], out=routed[start:end])
            start = end
        return out.index_add_(0, tokens, routed)
