"""Checked wrappers over the C kernels; each returns None where the torch path must run.

The kernels cover a few rows (a decode step and its draft tokens) of fp32 or bf16 CPU tensors.
Checks are few and cheap: these run several times per layer per decode step. ``lib`` is the
library built for this CPU unless given (the tests pass other builds).
"""

from __future__ import annotations

from ctypes import CDLL

import torch
from torch import Tensor

from backend.native.build import library

# Rows the kernels take at once (a decode and up to three draft tokens).
MAX_ROWS = 4
# The kernels run on the calling thread. From this many weight bytes per call, torch's matmul,
# which splits the rows over its threads, is faster when it has more than one (an lm_head of
# 129280 x 384 in fp32 read in 10.7 ms on two threads against 17.3 ms on one); below it the
# kernels' lower cost per call wins.
LARGE_WEIGHT_BYTES = 4 << 20
_DTYPES = (torch.float32, torch.bfloat16)


def _threads_win(weight_bytes: int) -> bool:
    """Whether torch's threaded matmul should take a call that reads ``weight_bytes``."""
    return weight_bytes >= LARGE_WEIGHT_BYTES and torch.get_num_threads() > 1


def _rows_ok(x: Tensor, dtype: torch.dtype) -> bool:
    return x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype == dtype and x.is_cpu


def gemv(x: Tensor, weight: Tensor, lib: CDLL | None = None) -> Tensor | None:
    """x [N, in] @ weight [out, in]^T -> [N, out] in x's dtype; weight contiguous."""
    dtype = weight.dtype
    if not (
        dtype in _DTYPES
        and _rows_ok(x, dtype)
        and weight.is_cpu
        and weight.dim() == 2
        and weight.shape[1] == x.shape[1]
        and weight.is_contiguous()
    ) or _threads_win(weight.numel() * weight.element_size()):
        return None
    lib = lib or library()
    if lib is None:
        return None
    x = x.contiguous()
    rows, out_features = x.shape[0], weight.shape[0]
    out = torch.empty(rows, out_features, dtype=dtype)
    kernel = lib.gemv_bf16 if dtype == torch.bfloat16 else lib.gemv_f32
    kernel(weight.data_ptr(), x.data_ptr(), out.data_ptr(), out_features, x.shape[1], rows)
    return out


def rms_norm(x: Tensor, weight: Tensor, eps: float, lib: CDLL | None = None) -> Tensor | None:
    """weight * dtype(x / rms(x)) with rms in fp32: x [N, D], weight [D], one dtype."""
    dtype = weight.dtype
    if not (
        dtype in _DTYPES
        and _rows_ok(x, dtype)
        and weight.is_cpu
        and weight.shape == (x.shape[1],)
        and weight.is_contiguous()
    ):
        return None
    lib = lib or library()
    if lib is None:
        return None
    x = x.contiguous()
    out = torch.empty_like(x)
    kernel = lib.rms_norm_bf16 if dtype == torch.bfloat16 else lib.rms_norm_f32
    kernel(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
    return out


def moe(
    x: Tensor,
    w13: Tensor,
    w2: Tensor,
    ids: Tensor,
    weights: Tensor,
    shared: tuple[Tensor, Tensor, Tensor] | None,
    lib: CDLL | None = None,
) -> Tensor | None:
    """A MoE layer's output for a few rows: sum_j weights[t, j] * expert_{ids[t, j]}(x[t]), plus
    the shared expert (gate [S, D], up [S, D], down [D, S] weights) when given.

    x [N, D]; w13 [E, 2I, D] (each expert's gate rows then up rows), w2 [E, D, I]; ids [N, k]
    int64, each in 0..E-1 (the router's choice: not checked here); weights [N, k] fp32.
    """
    dtype = x.dtype
    num_rows, dim = x.shape if x.dim() == 2 else (0, 0)
    if not (
        dtype in _DTYPES
        and _rows_ok(x, dtype)
        and w13.dtype == dtype
        and w2.dtype == dtype
        and w13.is_cpu
        and w13.dim() == 3
        and w13.shape[2] == dim
        and w2.shape == (w13.shape[0], dim, w13.shape[1] // 2)
        and w13.is_contiguous()
        and w2.is_contiguous()
        and ids.dtype == torch.int64
        and ids.shape == weights.shape
        and ids.shape[0] == num_rows
        and weights.dtype == torch.float32
    ) or _threads_win(ids.numel() * (w13[0].numel() + w2[0].numel()) * w13.element_size()):
        return None
    shared_ptrs: tuple[int | None, int | None, int | None] = (None, None, None)
    shared_inter = 0
    if shared is not None:
        gate, up, down = shared
        shared_inter = gate.shape[0]
        if not all(
            w.dtype == dtype and w.is_cpu and w.is_contiguous() and w.shape == shape
            for w, shape in zip(
                shared, ((shared_inter, dim), (shared_inter, dim), (dim, shared_inter)), strict=True
            )
        ):
            return None
        shared_ptrs = (gate.data_ptr(), up.data_ptr(), down.data_ptr())
    lib = lib or library()
    if lib is None:
        return None
    x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
    out = torch.empty_like(x)
    kernel = lib.moe_bf16 if dtype == torch.bfloat16 else lib.moe_f32
    status = kernel(
        x.data_ptr(), num_rows, dim, w13.data_ptr(), w2.data_ptr(), w2.shape[2],
        ids.data_ptr(), weights.data_ptr(), ids.shape[1], *shared_ptrs, shared_inter,
        out.data_ptr(),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("native MoE kernel could not allocate its scratch buffers")
    return out


def mla_decode(
    q_nope: Tensor,
    q_pe: Tensor,
    kv: Tensor,
    block_table: list[int],
    length: int,
    block_size: int,
    kv_b_weight: Tensor,
    v_head_dim: int,
    scale: float,
    lib: CDLL | None = None,
) -> Tensor | None:
    """One sequence's decode token through weight-absorbed attention, computed in fp32.

    q_nope [1, H, nope], q_pe [1, H, rope] (rotated); kv: the cache layer [slots, r + rope];
    ``block_table`` covers ``length`` cached tokens (the new one included); kv_b_weight
    [H * (nope + v), r]. Returns [1, H, v] in the query's dtype.
    """
    dtype = q_nope.dtype
    _, heads, nope = q_nope.shape if q_nope.dim() == 3 else (0, 0, 0)
    rope = q_pe.shape[-1]
    rank = kv_b_weight.shape[-1]
    if not (
        dtype in _DTYPES
        and q_nope.shape[0] == 1
        and q_pe.shape == (1, heads, rope)
        and q_pe.dtype == kv.dtype == kv_b_weight.dtype == dtype
        and q_nope.is_cpu
        and kv.is_cpu
        and kv.dim() == 2
        and kv.shape[1] == rank + rope
        and kv_b_weight.shape == (heads * (nope + v_head_dim), rank)
        and kv.is_contiguous()
        and kv_b_weight.is_contiguous()
        and 0 < length <= len(block_table) * block_size
    ) or _threads_win((kv_b_weight.numel() + length * kv.shape[1]) * kv.element_size()):
        return None
    lib = lib or library()
    if lib is None:
        return None
    blocks = block_table[: -(-length // block_size)]
    if min(blocks) < 0 or (max(blocks) + 1) * block_size > kv.shape[0]:
        raise ValueError("block table points outside the cache")
    table = torch.tensor(blocks, dtype=torch.int64)
    q_nope, q_pe = q_nope.contiguous(), q_pe.contiguous()
    out = torch.empty(1, heads, v_head_dim, dtype=dtype)
    kernel = lib.mla_decode_bf16 if dtype == torch.bfloat16 else lib.mla_decode_f32
    status = kernel(
        q_nope.data_ptr(), q_pe.data_ptr(), kv.data_ptr(), table.data_ptr(), length, block_size,
        kv_b_weight.data_ptr(), heads, nope, rope, v_head_dim, rank, scale, out.data_ptr(),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("native MLA decode kernel could not allocate its scratch buffer")
    return out
