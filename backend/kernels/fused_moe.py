"""Fused MoE: the routed experts as two grouped GEMMs over the tokens each expert received.

Weights are stacked per layer: ``w13`` [E, 2I, D] (gate rows then up rows) and ``w2`` [E, D, I],
bf16/fp32, or e4m3 with fp32 scales per 128x128 block (``w13_scale`` [E, ceil(I/128) * 2,
ceil(D/128)]: the gate's grid then the up's; ``w2_scale`` [E, ceil(D/128), ceil(I/128)]).
out[t] = sum_j route_weight[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = expert_ids[t, j].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from backend.kernels import support
from backend.model import fp8


@dataclass(frozen=True)
class StackedExperts:
    """One MoE layer's routed experts stacked for the kernel (scales None for bf16/fp32)."""

    w13: Tensor  # [E, 2I, D]
    w2: Tensor  # [E, D, I]
    w13_scale: Tensor | None = None  # [E, 2 * ceil(I / 128), ceil(D / 128)]
    w2_scale: Tensor | None = None  # [E, ceil(D / 128), ceil(I / 128)]


@dataclass(frozen=True)
class MoETiles:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def choose_tiles(num_pairs: int, num_experts: int) -> MoETiles:
    """Decode (a few rows per expert) uses 16-row blocks so little work is padding; prefill
    uses 64-row blocks that reuse each weight tile (the fastest correct tilings at V3.1's widths
    on an H200, ``benchmarks/kernel_tiles.py``)."""
    if num_pairs <= 4 * num_experts:
        return MoETiles(16, 64, 128, 4, 4)
    return MoETiles(64, 128, 128, 4, 3)


@dataclass(frozen=True)
class ExpertLayout:
    """(token, slot) pairs grouped by expert, each group padded to ``block_m`` rows.

    ``pairs`` [num_blocks * block_m] int32 holds flat pair indices t * top_k + j, padding holds
    ``num_pairs``; ``block_expert`` [num_blocks] int32 is each block's expert or -1 when unused.
    num_blocks is an upper bound known without reading the routing back to the host.
    """

    pairs: Tensor
    block_expert: Tensor
    num_pairs: int
    block_m: int


def align_by_expert(expert_ids: Tensor, num_experts: int, block_m: int) -> ExpertLayout:
    flat = expert_ids.flatten().long()
    num_pairs = int(flat.numel())
    device = flat.device
    # Each expert with tokens adds at most one partially filled block.
    num_blocks = -(-num_pairs // block_m) + min(num_experts, num_pairs)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    start = counts.cumsum(0) - counts
    padded_start = padded.cumsum(0) - padded
    sorted_experts = flat[order]
    rank = torch.arange(num_pairs, device=device) - start[sorted_experts]
    pairs = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    pairs[padded_start[sorted_experts] + rank] = order.to(torch.int32)
    block_expert = torch.full((num_blocks,), -1, dtype=torch.int32, device=device)
    experts = torch.arange(num_experts, device=device, dtype=torch.int32)
    used = torch.repeat_interleave(experts, padded // block_m)
    block_expert[: used.numel()] = used
    return ExpertLayout(pairs, block_expert, num_pairs, block_m)


# --- torch reference (the CPU path for stacked weights, and the oracle) ----------------------


def _dense(weight: Tensor, scale: Tensor | None, dtype: torch.dtype) -> Tensor:
    if scale is None:
        return weight.to(dtype)
    return fp8.dequantize(weight, scale, dtype=dtype)


def fused_moe_reference(
    x: Tensor, experts: StackedExperts, route_weights: Tensor, expert_ids: Tensor
) -> Tensor:
    """[T, D] in x's dtype, computed in fp32 one expert at a time (FP8 experts dequantized one
    at a time too)."""
    w13, w2, w13_scale, w2_scale = experts.w13, experts.w2, experts.w13_scale, experts.w2_scale
    num_tokens, top_k = expert_ids.shape
    inter = w2.shape[2]
    gate_rows = -(-inter // 128)
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    for expert in expert_ids.unique().tolist():
        tokens, slots = (expert_ids == expert).nonzero(as_tuple=True)
        if w13_scale is not None:
            scale = w13_scale[expert]
            gate = _dense(w13[expert, :inter], scale[:gate_rows], torch.float32)
            up = _dense(w13[expert, inter:], scale[gate_rows:], torch.float32)
        else:
            gate, up = w13[expert, :inter].float(), w13[expert, inter:].float()
        down_scale = None if w2_scale is None else w2_scale[expert]
        down = _dense(w2[expert], down_scale, torch.float32)
        rows = x[tokens].float()
        hidden = F.silu(rows @ gate.t()) * (rows @ up.t())
        weighted = (hidden @ down.t()) * route_weights[tokens, slots, None].float()
        out.index_add_(0, tokens, weighted)
    return out.to(x.dtype)


# --- wrapper ---------------------------------------------------------------------------------


def _check(
    x: Tensor,
    w13: Tensor,
    w2: Tensor,
    route_weights: Tensor,
    expert_ids: Tensor,
    w13_scale: Tensor | None,
    w2_scale: Tensor | None,
) -> None:
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError("x must be [T, D], w13 [E, 2I, D] and w2 [E, D, I]")
    num_experts, two_inter, dim = w13.shape
    inter = two_inter // 2
    if x.shape[1] != dim or w2.shape != (num_experts, dim, inter) or two_inter != 2 * inter:
        raise ValueError(
            f"shapes disagree: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}"
        )
    if route_weights.shape != expert_ids.shape or expert_ids.shape[0] != x.shape[0]:
        raise ValueError("route_weights and expert_ids must both be [T, top_k]")
    quantized = w13.dtype == fp8.FP8_DTYPE
    if quantized != (w2.dtype == fp8.FP8_DTYPE) or quantized != (w13_scale is not None):
        raise ValueError("FP8 experts need both weights in e4m3 and both scale grids")
    if quantized:
        assert w13_scale is not None and w2_scale is not None
        gate_rows, dim_blocks = -(-inter // 128), -(-dim // 128)
        if w13_scale.shape != (num_experts, 2 * gate_rows, dim_blocks):
            raise ValueError(f"w13_scale shape {tuple(w13_scale.shape)} does not fit w13")
        if w2_scale.shape != (num_experts, dim_blocks, gate_rows):
            raise ValueError(f"w2_scale shape {tuple(w2_scale.shape)} does not fit w2")
    for name, tensor in (("x", x), ("w13", w13), ("w2", w2)):
        support.check_contiguous_rows(name, tensor)


def fused_moe(
    x: Tensor,
    experts: StackedExperts,
    route_weights: Tensor,
    expert_ids: Tensor,
    tiles: MoETiles | None = None,
) -> Tensor:
    """Triton: what ``fused_moe_reference`` computes, [T, D] in x's dtype. x [T, D],
    route_weights [T, top_k] (fp32), expert_ids [T, top_k]."""
    w13, w2, w13_scale, w2_scale = experts.w13, experts.w2, experts.w13_scale, experts.w2_scale
    support.check_device(x, w13, w2, route_weights, expert_ids)
    from backend.kernels import _fused_moe_triton as kernels

    _check(x, w13, w2, route_weights, expert_ids, w13_scale, w2_scale)
    num_tokens, top_k = expert_ids.shape
    num_experts, _, dim = w13.shape
    inter = w2.shape[2]
    quantized = w13_scale is not None
    tiles = tiles or choose_tiles(num_tokens * top_k, num_experts)
    if 128 % tiles.block_k:
        raise ValueError(f"block_k {tiles.block_k} must divide the scale block 128")
    layout = align_by_expert(expert_ids, num_experts, tiles.block_m)
    upcast = support.upcast_loads(x)
    act_dtype = torch.float32 if upcast else x.dtype
    x_in = x.to(act_dtype)
    hidden = torch.empty(layout.num_pairs, inter, dtype=act_dtype, device=x.device)
    routed = torch.empty(layout.num_pairs, dim, dtype=torch.float32, device=x.device)
    routes = route_weights.float().contiguous().view(-1)
    s13 = w13_scale if w13_scale is not None else routes  # unread unless FP8
    s2 = w2_scale if w2_scale is not None else routes
    num_blocks = layout.block_expert.numel()
    common = {
        "FP8": quantized, "UPCAST": upcast, "SCALE_N": 128, "SCALE_K": 128,
        "BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n, "BLOCK_K": tiles.block_k,
        "num_warps": tiles.num_warps, "num_stages": tiles.num_stages,
    }  # fmt: skip
    kernels.gate_up_kernel[(num_blocks, -(-inter // tiles.block_n))](
        x_in, w13, s13, hidden, layout.pairs, layout.block_expert,
        layout.num_pairs, dim, inter, -(-inter // 128),
        x_in.stride(0), w13.stride(0), w13.stride(1),
        s13.stride(0) if quantized else 0, s13.stride(1) if quantized else 0, hidden.stride(0),
        TOP_K=top_k, **common,
    )  # fmt: skip
    kernels.down_kernel[(num_blocks, -(-dim // tiles.block_n))](
        hidden, w2, s2, routed, layout.pairs, layout.block_expert, routes,
        layout.num_pairs, dim, inter,
        hidden.stride(0), w2.stride(0), w2.stride(1),
        s2.stride(0) if quantized else 0, s2.stride(1) if quantized else 0, routed.stride(0),
        **common,
    )  # fmt: skip
    return routed.view(num_tokens, top_k, dim).sum(dim=1).to(x.dtype)
