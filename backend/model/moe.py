"""DeepSeek-V3 mixture of experts: noaux_tc group-limited routing, routed and shared experts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backend.kernels import small_ops, support
from backend.kernels.fused_moe import StackedExperts, fused_moe
from backend.model.config import ModelConfig, MoEConfig
from backend.model.fp8_linear import FP8Linear
from backend.model.layers import SwiGLU
from backend.native import ops


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
        x32 = x.float()
        logits = ops.gemv(x32, self.weight) if x.shape[0] <= ops.MAX_ROWS else None
        if logits is None:
            logits = F.linear(x32, self.weight)
        moe = self.moe
        if support.use_kernels(logits) and small_ops.routable(
            moe.n_routed_experts, moe.n_group, moe.topk_group, moe.num_experts_per_tok
        ):
            return small_ops.route(
                logits, self.e_score_correction_bias, moe.n_group, moe.topk_group,
                moe.num_experts_per_tok, moe.norm_topk_prob, moe.routed_scaling_factor,
            )  # fmt: skip
        return route_noaux_tc(logits, self.e_score_correction_bias, moe)


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
        self.stacked: StackedExperts | None = None  # set by pack_experts for the fused kernel

    @torch.no_grad()
    def pack_experts(self) -> StackedExperts:
        """Stack the routed experts' weights ([E, 2I, D] gate then up, [E, D, I] down, and the
        FP8 scale grids alike) for ``fused_moe``; each expert's parameters become views into the
        stacks, so memory does not grow beyond one layer's copy while packing."""
        if self.stacked is not None:
            return self.stacked
        experts = [cast(SwiGLU, expert) for expert in self.experts]
        gates = [expert.gate_proj for expert in experts]
        ups = [expert.up_proj for expert in experts]
        downs = [expert.down_proj for expert in experts]
        w13 = torch.cat((_stack(gates, "weight"), _stack(ups, "weight")), dim=1)
        w2 = _stack(downs, "weight")
        w13_scale = w2_scale = None
        if isinstance(gates[0], FP8Linear):
            w13_scale = torch.cat(
                (_stack(gates, "weight_scale_inv"), _stack(ups, "weight_scale_inv")), dim=1
            )
            w2_scale = _stack(downs, "weight_scale_inv")
        inter, gate_rows = w2.shape[2], w13_scale.shape[1] // 2 if w13_scale is not None else 0
        for index, expert in enumerate(experts):
            _rebind(expert.gate_proj, w13[index, :inter], w13_scale, index, slice(0, gate_rows))
            _rebind(expert.up_proj, w13[index, inter:], w13_scale, index, slice(gate_rows, None))
            _rebind(expert.down_proj, w2[index], w2_scale, index, slice(None))
        self.stacked = StackedExperts(w13, w2, w13_scale, w2_scale)
        return self.stacked

    def forward(self, x: Tensor) -> Tensor:  # x: [T, D] -> [T, D]
        weights, ids = self.gate(x)
        if self.stacked is not None and x.shape[0] <= ops.MAX_ROWS:
            fused = ops.moe(x, self.stacked.w13, self.stacked.w2, ids, weights, self._shared())
            if fused is not None:  # the C kernel on CPU: every expert in one call
                return fused
        out = self.shared_experts(x) if self.shared_experts is not None else torch.zeros_like(x)
        if self.stacked is not None and support.use_kernels(x):
            return out + fused_moe(x, self.stacked, weights, ids)
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

    def _shared(self) -> tuple[Tensor, Tensor, Tensor] | None:
        """The shared experts' gate, up and down weights, as the C kernel takes them."""
        if self.shared_experts is None:
            return None
        shared = self.shared_experts
        return shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight


def _stack(linears: Sequence[nn.Module], attribute: str) -> Tensor:
    return torch.stack([getattr(linear, attribute) for linear in linears])


def _rebind(
    linear: nn.Module, weight: Tensor, scales: Tensor | None, index: int, rows: slice
) -> None:
    """Point a linear's weight (and FP8 scale grid) at its slice of the stacked tensors."""
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if scales is not None:
        linear.weight_scale_inv = scales[index, rows]
