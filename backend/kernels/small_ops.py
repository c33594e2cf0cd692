"""Fused small kernels of the step: RMSNorm with the residual add before it, SiLU(gate) x up,
the latent's norm and rotation written straight into the paged cache, and the router's
group-limited top-k (its reference is ``backend.model.moe.route_noaux_tc``).

Each wrapper checks its inputs and launches one Triton kernel (``_small_triton``); the torch
functions beside them are the references the tests compare with and the path every device
without the kernels takes. On a GPU they save the launches and the intermediate tensors of the
unfused ops (an add, a cast, a square, a mean, a multiply), which a decode step pays per layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from backend.kernels.support import check_contiguous_rows, check_device

# Widest row one program handles as a single tile (V3.1's hidden size is 7,168).
MAX_NORM_WIDTH = 16384
SILU_BLOCK = 1024
NUM_WARPS = 4  # as compile_check compiles them


def add_rms_norm_reference(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(weight * rmsnorm(h), h) with h = x + residual (x itself without one), as the model's
    unfused RMSNorm computes it."""
    h = x if residual is None else x + residual
    h32 = h.float()
    normed = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(h.dtype), h


def silu_mul_reference(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


def add_rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """x [T, D] (and residual [T, D]), weight [D] -> (normed [T, D], h [T, D]) in one kernel."""
    from backend.kernels import _small_triton as kernels

    if x.dim() != 2:
        raise ValueError(f"x must be [T, D], got {tuple(x.shape)}")
    tokens, width = x.shape
    if weight.shape != (width,):
        raise ValueError(f"weight must be [{width}], got {tuple(weight.shape)}")
    if not 0 < width <= MAX_NORM_WIDTH:
        raise ValueError(f"rows of {width} values: at most {MAX_NORM_WIDTH}")
    tensors = [x, weight] if residual is None else [x, weight, residual]
    check_device(*tensors)
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError("residual must match x in shape and dtype")
    if weight.dtype != x.dtype:
        raise ValueError(f"weight is {weight.dtype}, x is {x.dtype}")
    for name, tensor in zip(("x", "weight", "residual"), tensors, strict=False):
        check_contiguous_rows(name, tensor)
    out = torch.empty_like(x)
    h = x if residual is None else torch.empty_like(x)
    if tokens:
        r = residual if residual is not None else x
        kernels.add_rms_norm_kernel[(tokens,)](
            x, r, weight, out, h, width, eps,
            x.stride(0), r.stride(0), out.stride(0), h.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK_D=triton_width(width),
            num_warps=NUM_WARPS, num_stages=1,
        )  # fmt: skip
    return out, h


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up for gate, up [T, D] of one dtype, in one kernel."""
    from backend.kernels import _small_triton as kernels

    if gate.dim() != 2 or gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate and up must be [T, D] alike: {gate.shape} {up.shape}")
    check_device(gate, up)
    check_contiguous_rows("gate", gate)
    check_contiguous_rows("up", up)
    tokens, width = gate.shape
    out = torch.empty_like(gate)
    if tokens and width:
        block = min(SILU_BLOCK, triton_width(width))
        kernels.silu_mul_kernel[(tokens, -(-width // block))](
            gate, up, out, width, gate.stride(0), up.stride(0), out.stride(0), BLOCK_D=block,
            num_warps=NUM_WARPS, num_stages=1,
        )  # fmt: skip
    return out


def write_latents_reference(
    kv: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor, cache: Tensor, slots: Tensor
) -> None:
    """The unfused path: kv [T, lora + rope] (kv_a's output) -> [rmsnorm(c_kv) * weight |
    rotated k_pe] stored at ``slots`` of ``cache`` [slots, lora + rope]."""
    from backend.model.rope import apply_rotary

    lora = weight.shape[0]
    c_kv, k_pe = kv[:, :lora], kv[:, lora:]
    normed = add_rms_norm_reference(c_kv, weight, eps)[0]
    latent = torch.cat((normed, apply_rotary(k_pe, cos, sin)), dim=-1)
    cache.index_copy_(0, slots, latent.to(cache.dtype))


def write_latents(
    kv: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor, cache: Tensor, slots: Tensor
) -> None:
    """``write_latents_reference`` in one kernel: kv [T, lora + rope], weight [lora], cos and
    sin [T, rope / 2] fp32, cache [S, lora + rope] of kv's dtype, slots [T] long (each < S)."""
    from backend.kernels import _small_triton as kernels

    if kv.dim() != 2 or weight.dim() != 1 or cache.dim() != 2:
        raise ValueError("kv [T, lora + rope], weight [lora], cache [slots, lora + rope]")
    tokens, width = kv.shape
    lora = weight.shape[0]
    half = (width - lora) // 2
    if width <= lora or (width - lora) % 2 or cache.shape[1] != width:
        raise ValueError(f"kv rows of {width} and cache rows of {cache.shape[1]} for lora {lora}")
    if cos.shape != (tokens, half) or sin.shape != (tokens, half):
        raise ValueError(f"cos and sin must be [{tokens}, {half}]")
    if slots.shape != (tokens,) or slots.dtype != torch.long:
        raise ValueError("slots must be [T] long")
    if weight.dtype != kv.dtype or cache.dtype != kv.dtype:
        raise ValueError("kv, weight and cache must share a dtype")
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError("cos and sin must be fp32")
    check_device(kv, weight, cos, sin, cache, slots)
    for name, tensor in (("kv", kv), ("cos", cos), ("sin", sin), ("cache", cache)):
        check_contiguous_rows(name, tensor)
    if tokens:
        kernels.latent_write_kernel[(tokens,)](
            kv, weight, cos, sin, slots, cache, eps,
            kv.stride(0), cos.stride(0), sin.stride(0), cache.stride(0),
            LORA=lora, HALF_ROPE=half, LORA_PAD=triton_width(lora), HALF_PAD=triton_width(half),
            num_warps=NUM_WARPS, num_stages=1,
        )  # fmt: skip


def route(
    logits: Tensor,
    bias: Tensor,
    n_group: int,
    topk_group: int,
    top_k: int,
    normalize: bool,
    scaling: float,
) -> tuple[Tensor, Tensor]:
    """noaux_tc routing of logits [T, E] with bias [E] in one kernel: (weights [T, top_k] fp32,
    expert ids [T, top_k] long), as ``route_noaux_tc`` chooses them. E / n_group and n_group
    must be powers of two (256 experts in 8 groups for V3.1)."""
    from backend.kernels import _small_triton as kernels

    if logits.dim() != 2 or bias.shape != (logits.shape[1],):
        raise ValueError(f"logits [T, E] and bias [E], got {logits.shape} and {bias.shape}")
    tokens, experts = logits.shape
    if n_group < 1 or experts % n_group:
        raise ValueError(f"{experts} experts do not split into {n_group} groups")
    per_group = experts // n_group
    if not routable(experts, n_group, topk_group, top_k):
        raise ValueError(
            f"the kernel routes power-of-two groups ({n_group} x {per_group}) to a top-{top_k} "
            f"within {topk_group} groups"
        )
    check_device(logits, bias)
    check_contiguous_rows("logits", logits)
    bias = bias.contiguous()
    weights = torch.empty(tokens, top_k, device=logits.device, dtype=torch.float32)
    ids = torch.empty(tokens, top_k, device=logits.device, dtype=torch.long)
    if tokens:
        kernels.route_kernel[(tokens,)](
            logits, bias, weights, ids, logits.stride(0), weights.stride(0), ids.stride(0),
            scaling, N_GROUP=n_group, PER_GROUP=per_group, TOPK_GROUP=topk_group, TOP_K=top_k,
            TOP_K_PAD=triton_width(top_k), GROUPED=n_group > 1 and topk_group < n_group,
            NORM=normalize, num_warps=NUM_WARPS, num_stages=1,
        )  # fmt: skip
    return weights, ids


def routable(experts: int, n_group: int, topk_group: int, top_k: int) -> bool:
    """Whether ``route``'s kernel takes this router's shape."""
    if n_group < 1 or experts % n_group:
        return False
    per_group = experts // n_group
    return (
        triton_width(n_group) == n_group
        and triton_width(per_group) == per_group
        and per_group >= 2
        and 1 <= topk_group <= n_group
        and 1 <= top_k <= topk_group * per_group
    )


def triton_width(width: int) -> int:
    """The power of two at least ``width`` (a Triton tile's size)."""
    return 1 << max(0, width - 1).bit_length()
