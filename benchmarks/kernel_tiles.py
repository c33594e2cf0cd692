"""Each Triton kernel's tile sizes swept at DeepSeek-V3.1's widths on a CUDA GPU.

    python benchmarks/kernel_tiles.py [--kernels gemm,mla,moe] [--budget-s 180]

For every shape, each candidate tiling is checked against the torch reference (relative L2
error under MAX_ERROR, else it is marked wrong and never chosen) and timed with triton's
do_bench; the wrapper's own choice is printed first, then the fastest correct candidate and its
speed-up. ``--budget-s`` stops the sweep when its time is spent (compiling each candidate costs
seconds) and prints what was measured. ``--smoke`` runs tiny widths on the CPU under Triton's
interpreter, to check the script itself; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernel_shapes import (  # noqa: E402
    H200_BF16_FLOPS,
    H200_COPY_BYTES_S,
    H200_FP8_FLOPS,
    REAL,
    SMOKE,
    Widths,
    measure,
    random_experts,
)

MAX_ERROR = 2e-2  # relative L2 error against the fp32 reference (bf16 outputs)


@dataclass(frozen=True)
class Shape:
    """One problem: how to run it with given tiles, its reference output, and its cost."""

    name: str
    run: Callable[[Any], torch.Tensor]  # tiles (None: the wrapper's choice) -> output
    reference: Callable[[], torch.Tensor]
    num_bytes: float
    flops: float
    flops_peak: float
    candidates: list[Any]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.float()
    return float((got.float() - want).norm() / want.norm().clamp(min=1e-30))


def gemm_shapes(w: Widths, device: torch.device) -> Iterable[Shape]:
    from backend.kernels import fp8_gemm
    from backend.kernels.fp8_gemm import GemmTiles
    from backend.model import fp8

    act = torch.bfloat16 if device.type == "cuda" else torch.float32
    cases = [
        ("dense down", w.dense_inter, w.hidden, 1),
        ("dense down", w.dense_inter, w.hidden, 64),
    ]
    cases.append(("dense up", w.hidden, w.dense_inter, 4096 if device.type == "cuda" else 64))
    for name, k, n, m in cases:
        weight = torch.randn(n, k, device=device).to(fp8.FP8_DTYPE)
        scale = torch.rand(fp8.scale_shape((n, k)), device=device) / k
        x = torch.randn(m, k, device=device, dtype=act)
        if m <= 16:
            tiles = [GemmTiles(16, bn, 128, wp, st) for bn in (32, 64, 128) for wp in (4, 8)
                     for st in (3, 5)]  # fmt: skip
        elif m <= 64:
            tiles = [GemmTiles(bm, bn, 128, wp, st) for bm in (32, 64) for bn in (64, 128)
                     for wp in (4, 8) for st in (3, 4)]  # fmt: skip
        else:
            blocks = ((128, 128), (128, 256), (256, 128))
            tiles = [GemmTiles(bm, bn, 128, wp, st) for bm, bn in blocks for wp in (4, 8)
                     for st in (3, 4)]  # fmt: skip
        for quantize in (True, False):
            mode = "w8a8" if quantize else "w-only"
            yield Shape(
                f"fp8 gemm {name} {mode} M={m} {k}->{n}",
                lambda t, x=x, weight=weight, scale=scale, q=quantize: fp8_gemm.fp8_linear(
                    x, weight, scale, quantize_activations=q, tiles=t
                ),
                partial(_gemm_reference, x, weight, scale, quantize),
                n * k + scale.numel() * 4 + (m * k + m * n) * x.element_size(),
                2.0 * m * n * k,
                H200_FP8_FLOPS if quantize else H200_BF16_FLOPS,
                tiles,
            )


def _gemm_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, w8a8: bool):  # type: ignore[no-untyped-def]
    from backend.kernels import fp8_gemm
    from backend.model import fp8

    if w8a8:
        return fp8_gemm.w8a8_reference(x, weight, scale)
    return x.float() @ fp8.dequantize(weight, scale, dtype=torch.float32).t()


def mla_shapes(w: Widths, device: torch.device) -> Iterable[Shape]:
    from backend.kernels import mla_decode
    from backend.kernels.mla_decode import DecodeTiles

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    latent = w.kv_lora_rank + w.rope
    scale = (w.nope + w.rope) ** -0.5
    cases = [(64, 4096), (1, 4096)] if device.type == "cuda" else [(2, 64)]
    for batch, context in cases:
        blocks = -(-context // w.page)
        kv = torch.randn(batch * blocks * w.page, latent, device=device, dtype=dtype)
        order = torch.randperm(batch * blocks).tolist()
        tables = mla_decode.block_table_tensor(
            [order[i * blocks : (i + 1) * blocks] for i in range(batch)], device
        )
        seq, length = mla_decode.token_layout([1] * batch, [context] * batch, device)
        q = torch.randn(batch, w.heads, w.kv_lora_rank, device=device, dtype=dtype)
        q_pe = torch.randn(batch, w.heads, w.rope, device=device, dtype=dtype)
        args = (q, q_pe, kv, tables, seq, length, scale, w.page)
        tiles = [DecodeTiles(bh, bn, None, wp, st) for bh in (16, 32, 64) for bn in (32, 64)
                 for wp in (4, 8) for st in (1, 2)]  # fmt: skip
        yield Shape(
            f"mla decode batch {batch} context {context}",
            lambda t, args=args: mla_decode.mla_decode(*args, tiles=t),
            lambda args=args: mla_decode.mla_decode_reference(*args),
            batch * context * latent * kv.element_size(),
            2.0 * batch * w.heads * context * (latent + w.kv_lora_rank),
            H200_BF16_FLOPS,
            tiles,
        )


def moe_shapes(w: Widths, device: torch.device) -> Iterable[Shape]:
    from backend.kernels import fused_moe
    from backend.kernels.fused_moe import MoETiles

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    _, experts = random_experts(w, device, dtype)
    expert_params = 3 * w.hidden * w.moe_inter
    for tokens in (8, 64, 4096) if device.type == "cuda" else (4,):
        x = torch.randn(tokens, w.hidden, device=device, dtype=dtype)
        weights, ids = torch.rand(tokens, w.experts, device=device).topk(w.top_k, dim=-1)
        hit = int(ids.unique().numel())
        if tokens * w.top_k <= 4 * w.experts:
            tiles = [MoETiles(bm, bn, bk, wp, st) for bm in (16,) for bn in (32, 64, 128)
                     for bk in (64, 128) for wp in (4, 8) for st in (3, 4)]  # fmt: skip
        else:
            tiles = [MoETiles(bm, bn, bk, wp, st) for bm in (64, 128) for bn in (64, 128)
                     for bk in (64, 128) for wp in (4, 8) for st in (3,)]  # fmt: skip
        yield Shape(
            f"fused moe fp8 T={tokens} ({hit} experts hit)",
            lambda t, x=x, wt=weights, i=ids: fused_moe.fused_moe(x, experts, wt, i, tiles=t),
            lambda x=x, wt=weights, i=ids: fused_moe.fused_moe_reference(x, experts, wt, i),
            hit * expert_params + 2 * tokens * w.hidden * x.element_size(),
            2.0 * tokens * w.top_k * expert_params,
            H200_BF16_FLOPS,
            tiles,
        )


def describe(shape: Shape, seconds: float) -> str:
    bandwidth, rate = shape.num_bytes / seconds, shape.flops / seconds
    return (
        f"{seconds * 1e6:9.1f} us {bandwidth / H200_COPY_BYTES_S:6.1%} of HBM "
        f"{rate / shape.flops_peak:6.1%} of peak"
    )


def sweep(shape: Shape, device: torch.device, deadline: float) -> None:
    want = shape.reference()
    base = measure(lambda: shape.run(None), device)
    print(f"{shape.name}\n  wrapper's choice              {describe(shape, base)}", flush=True)
    best: tuple[float, Any] | None = None
    for tiles in shape.candidates:
        if time.monotonic() > deadline:
            print("  (time budget spent: the remaining candidates were not run)")
            break
        try:
            error = relative_error(shape.run(tiles), want)
        except Exception as exc:  # a tiling that does not compile or launch (shared memory)
            print(f"  {tiles}: failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if error > MAX_ERROR:
            print(f"  {tiles}: WRONG (relative error {error:.3g})")
            continue
        seconds = measure(lambda t=tiles: shape.run(t), device)
        print(f"  {tiles}: {describe(shape, seconds)}", flush=True)
        if best is None or seconds < best[0]:
            best = (seconds, tiles)
    if best is not None:
        print(f"  fastest: {best[1]}: {describe(shape, best[0])}, {base / best[0]:.2f}x the choice")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", default="mla,moe,gemm")
    parser.add_argument("--budget-s", type=float, default=240.0, help="shared equally")
    parser.add_argument("--smoke", action="store_true", help="tiny widths on CPU (interpreter)")
    args = parser.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        device, widths = torch.device("cpu"), SMOKE
    elif torch.cuda.is_available():
        device, widths = torch.device("cuda"), REAL
        print(f"device: {torch.cuda.get_device_name()}")
    else:
        print("no CUDA GPU: run on an H200 (or pass --smoke to check the script)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    end = time.monotonic() + args.budget_s
    makers = {"gemm": gemm_shapes, "mla": mla_shapes, "moe": moe_shapes}
    kernels = args.kernels.split(",")
    for done, kernel in enumerate(kernels):
        # each kernel gets an equal share of what is left
        deadline = time.monotonic() + (end - time.monotonic()) / (len(kernels) - done)
        for shape in makers[kernel](widths, device):
            if args.smoke:
                shape = Shape(**{**shape.__dict__, "candidates": shape.candidates[:2]})
            sweep(shape, device, deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
