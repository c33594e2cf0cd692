"""Shapes, limits and timing shared by ``benchmarks/kernels.py`` and its model slice."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# H200 limits: HBM3e 4.8 TB/s on the spec sheet, about 4.3 TB/s measured by a large copy;
# dense tensor-core peaks without sparsity.
H200_SPEC_BYTES_S = 4.8e12
H200_COPY_BYTES_S = 4.3e12
H200_BF16_FLOPS = 989e12
H200_FP8_FLOPS = 1979e12


@dataclass(frozen=True)
class Widths:
    """The model widths a run uses: DeepSeek-V3.1's, or tiny ones for a smoke run on CPU."""

    hidden: int
    heads: int
    q_lora_rank: int
    kv_lora_rank: int
    rope: int
    nope: int
    v_head: int
    experts: int
    top_k: int
    moe_inter: int
    dense_inter: int
    page: int


REAL = Widths(7168, 128, 1536, 512, 64, 128, 128, 256, 8, 2048, 18432, 64)
SMOKE = Widths(256, 4, 128, 64, 16, 32, 32, 8, 2, 128, 384, 16)


@dataclass(frozen=True)
class Row:
    """One measurement: what ran, its time, bytes and FLOPs, and the limits it is held to."""

    kernel: str
    case: str
    seconds: float
    num_bytes: float
    flops: float
    flops_peak: float
    torch_seconds: float | None = None

    def render(self) -> str:
        bandwidth = self.num_bytes / self.seconds
        rate = self.flops / self.seconds
        versus = ""
        if self.torch_seconds is not None:
            speedup = self.torch_seconds / self.seconds
            versus = f"  torch {self.torch_seconds * 1e6:9.1f} us (kernel {speedup:4.2f}x faster)"
        return (
            f"{self.kernel:<10} {self.case:<34} {self.seconds * 1e6:9.1f} us  "
            f"{bandwidth / 1e9:8.1f} GB/s ({bandwidth / H200_COPY_BYTES_S:6.1%} of measured HBM)  "
            f"{rate / 1e12:7.1f} TFLOP/s ({rate / self.flops_peak:6.1%} of peak){versus}"
        )


def measure(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds per call: triton's do_bench on CUDA (L2 flushed between calls), else the median
    of a few timed calls."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100)) / 1e3
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_experts(w: Widths, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    """One MoE layer's routed experts at widths `w`, random, stacked for the fused kernel: in
    `dtype` and the same values in FP8 (unit scales)."""
    from backend.kernels.fused_moe import StackedExperts
    from backend.model import fp8

    w13 = torch.randn(w.experts, 2 * w.moe_inter, w.hidden, device=device, dtype=dtype) / 50
    w2 = torch.randn(w.experts, w.hidden, w.moe_inter, device=device, dtype=dtype) / 50
    quantized = StackedExperts(
        w13.to(fp8.FP8_DTYPE),
        w2.to(fp8.FP8_DTYPE),
        torch.ones(w.experts, *fp8.scale_shape((2 * w.moe_inter, w.hidden)), device=device),
        torch.ones(w.experts, *fp8.scale_shape((w.hidden, w.moe_inter)), device=device),
    )
    return StackedExperts(w13, w2), quantized
