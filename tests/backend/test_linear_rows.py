"""linear_rows: every CPU form it picks (by CPU vendor) multiplies by the weight's transpose."""

from __future__ import annotations

import pytest
import torch

from backend.model import layers
from backend.model.layers import Linear, linear_rows


@pytest.mark.parametrize("gemm", [True, False])
@pytest.mark.parametrize("num_rows", [1, 2, 3, 4, 5, 9])
def test_every_form_equals_the_matmul(
    gemm: bool, num_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layers, "cpu_gemm_reads_once", lambda: gemm)
    generator = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(300, 64, generator=generator)
    x = torch.randn(num_rows, 64, generator=generator)
    out = linear_rows(x, weight)
    assert out.shape == (num_rows, 300)
    torch.testing.assert_close(out, (x.double() @ weight.double().T).float())


def test_linear_with_bias_keeps_the_bias() -> None:
    linear = Linear(8, 4, bias=True)
    x = torch.randn(2, 8)
    torch.testing.assert_close(linear(x), x @ linear.weight.T + linear.bias)
