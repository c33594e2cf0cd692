"""Under expert parallel a rank's local experts run through the fused MoE path (stacked, one
top-1 call of weight 1: the C kernel on CPU, Triton on GPU) and give what running them one
at a time gives."""

from __future__ import annotations

import pytest
import torch

from backend.demo_checkpoint import demo_config
from backend.model.config import ModelConfig
from backend.native import ops
from backend.native.build import library
from backend.parallel.layers import ParallelMoE
from backend.parallel.layout import Layout

pytestmark = pytest.mark.slow


def _local_moe(dtype: torch.dtype) -> ParallelMoE:
    config = ModelConfig.from_dict(demo_config("tiny", {}))
    torch.manual_seed(7)
    # rank 1 of 4: the group is not reached by the local experts
    moe = ParallelMoE(config, dtype, group=None, layout=Layout(1, 4, expert_parallel=True))  # type: ignore[arg-type]
    for parameter in moe.parameters():
        parameter.data.normal_(0, 0.05)
    return moe


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_local_experts_run_stacked_as_one_by_one(
    dtype: torch.dtype, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if library() is None:
        pytest.skip("no C compiler: the CPU kernels are not built")
    moe = _local_moe(dtype)
    assert len(moe.experts) == 2
    x = torch.randn(rows, moe.gate.weight.shape[1]).to(dtype)
    local_ids = torch.tensor([i % 2 for i in range(rows)], dtype=torch.long)
    one_by_one = moe._run_local_experts(x, local_ids)
    moe.pack_experts()
    calls: list[int] = []
    kernel = ops.moe

    def counted(*args: object, **kwargs: object) -> torch.Tensor | None:
        out = kernel(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(out is not None)
        return out

    monkeypatch.setattr(ops, "moe", counted)
    stacked = moe._run_local_experts(x, local_ids)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(stacked, one_by_one, atol=tolerance, rtol=tolerance)
    # decode-sized calls take the C kernel; larger ones run the experts one at a time
    assert calls == ([True] if rows <= ops.MAX_ROWS else [])
