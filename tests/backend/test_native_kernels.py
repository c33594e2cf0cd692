"""The C decode kernels (backend.native) against torch, in the build for this CPU and in the plain
C build (no AVX-512), and the torch path when no compiler is found."""

from __future__ import annotations

from ctypes import CDLL
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from backend.generate import new_cache
from backend.model.cache import ForwardBatch
from backend.model.checkpoint import load_model
from backend.model.layers import Linear
from backend.model.mla import attention_absorbed
from backend.model.model import DeepseekV3ForCausalLM
from backend.native import build, ops

DTYPES = [torch.float32, torch.bfloat16]
# A bf16 result may differ from the fp64 reference by its own rounding plus the rounding of
# values the torch path rounds too; fp32 ones by summation order only.
RTOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module", params=["native", "generic"])
def lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CDLL:
    if build.library() is None:
        pytest.skip("no C compiler on this machine")
    flags = () if request.param == "native" else ("-DGEMV_GENERIC",)
    return build.load_library(build.compile_library(flags, tmp_path_factory.mktemp("native")))


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == dtype
    scale = expected.abs().max().item()
    error = (actual.double() - expected).abs().max().item()
    assert error <= RTOL[dtype] * scale, f"error {error:.3e} against scale {scale:.3e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("out_features", "in_features"), [(1, 1), (7, 33), (130, 384), (9, 515)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_gemv_matches_matmul(
    lib: CDLL, dtype: torch.dtype, out_features: int, in_features: int, rows: int
) -> None:
    generator = torch.Generator().manual_seed(out_features * 10 + rows)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    x = torch.randn(rows, in_features, generator=generator).to(dtype)
    out = ops.gemv(x, weight, lib)
    assert out is not None and out.shape == (rows, out_features)
    _close(out, x.double() @ weight.double().T, dtype)


def test_gemv_declines_what_it_does_not_cover(lib: CDLL) -> None:
    weight = torch.randn(8, 16)
    assert ops.gemv(torch.randn(5, 16), weight, lib) is None  # more rows than a decode
    assert ops.gemv(torch.randn(1, 16).double(), weight.double(), lib) is None
    assert ops.gemv(torch.randn(1, 16).bfloat16(), weight, lib) is None  # mixed dtypes
    assert ops.gemv(torch.randn(1, 16), weight.T.contiguous().T, lib) is None  # strided


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 4])
def test_rms_norm_matches_torch(lib: CDLL, dtype: torch.dtype, rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    x = (3 * torch.randn(rows, 200, generator=generator)).to(dtype)
    weight = torch.randn(200, generator=generator).to(dtype)
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
    expected = weight * normed.to(dtype)
    out = ops.rms_norm(x[:, :], weight, 1e-6, lib)
    assert out is not None
    torch.testing.assert_close(out, expected, rtol=RTOL[dtype], atol=1e-5)


def _swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shared", [True, False])
def test_moe_matches_expert_sum(lib: CDLL, dtype: torch.dtype, shared: bool) -> None:
    generator = torch.Generator().manual_seed(int(shared))
    experts, dim, inter, rows, top_k = 6, 96, 40, 3, 2

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) / shape[-1] ** 0.5).to(dtype)

    w13, w2 = weight(experts, 2 * inter, dim), weight(experts, dim, inter)
    shared_weights = (weight(24, dim), weight(24, dim), weight(dim, 24)) if shared else None
    x = torch.randn(rows, dim, generator=generator).to(dtype)
    ids = torch.tensor([[0, 5], [3, 3], [2, 1]])
    coef = torch.rand(rows, top_k, generator=generator)
    out = ops.moe(x, w13, w2, ids, coef, shared_weights, lib)
    assert out is not None
    x64 = x.double()
    expected = torch.zeros(rows, dim, dtype=torch.float64)
    for t in range(rows):
        for j in range(top_k):
            e = int(ids[t, j])
            gate, up = w13[e, :inter].double(), w13[e, inter:].double()
            expected[t] += coef[t, j] * _swiglu(x64[t], gate, up, w2[e].double())
        if shared_weights is not None:
            expected[t] += _swiglu(x64[t], *(w.double() for w in shared_weights))
    _close(out, expected, dtype)


def test_moe_declines_fp8_experts(lib: CDLL) -> None:
    x = torch.randn(1, 32)
    w13 = torch.zeros(4, 16, 32, dtype=torch.float8_e4m3fn)
    w2 = torch.zeros(4, 32, 8, dtype=torch.float8_e4m3fn)
    ids, coef = torch.tensor([[1]]), torch.ones(1, 1)
    assert ops.moe(x, w13, w2, ids, coef, None, lib) is None


def _decode_logits(model: DeepseekV3ForCausalLM, prompt: list[int], rows: int) -> torch.Tensor:
    """[rows, vocab]: the prompt prefilled, then ``rows`` more tokens in one step (a decode
    step and its draft tokens)."""
    cache = new_cache(model, len(prompt) + rows)
    table = list(range(cache.num_blocks))
    model(ForwardBatch.for_prefill(prompt, 0, table, cache.block_size), cache)
    step = ForwardBatch.for_prefill(prompt[:rows], len(prompt), table, cache.block_size)
    return model.compute_logits(model(step, cache))


@pytest.mark.parametrize("rows", [1, 3])
def test_bf16_model_matches_torch_path(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """The bf16 model's decode logits through the C kernels agree with the torch path's within
    bf16 rounding."""
    if build.library() is None:
        pytest.skip("no C compiler on this machine")
    prompt = [11, 230, 4096, 17, 99, 3, 1000, 5]
    native = _decode_logits(load_model(tiny_dir, dtype=torch.bfloat16), prompt, rows)
    monkeypatch.setattr(ops, "library", lambda: None)
    expected = _decode_logits(load_model(tiny_dir, dtype=torch.bfloat16), prompt, rows)
    assert ((native - expected).abs().max() / expected.abs().max()).item() < 3e-2


def test_no_compiler_falls_back_to_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("GATEWAY_NATIVE_PREBUILT", str(tmp_path / "none"))  # no portable build
    build.library.cache_clear()
    try:
        assert build.library() is None
        weight, x = torch.randn(6, 10), torch.randn(1, 10)
        assert ops.gemv(x, weight) is None
        layer = Linear(10, 6, bias=False)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight))
    finally:
        build.library.cache_clear()


def test_no_compiler_loads_the_portable_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slim image has no compiler: the portable build its build stage made is loaded, and
    computes what torch does; without it, the torch path."""
    if build.library() is None:
        pytest.skip("no C compiler on this machine to make the portable build with")
    prebuilt = tmp_path / "prebuilt"
    build.main(["--portable", "--out", str(prebuilt)])  # every level, as the image's build does
    made = build.portable_for_this_cpu(prebuilt)
    assert made is not None and made.name.startswith("portable-x86-64-")
    assert len(list(prebuilt.glob("portable-*.so"))) == len(build.portable_levels())
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GATEWAY_NATIVE_PREBUILT", str(prebuilt))
    build.library.cache_clear()
    try:
        assert build.library() is not None
        weight, x = torch.randn(64, 96), torch.randn(1, 96)
        native = ops.gemv(x, weight)
        assert native is not None
        torch.testing.assert_close(native, F.linear(x, weight), rtol=1e-5, atol=1e-5)
        for path in prebuilt.glob("portable-*.so"):
            path.rename(path.with_suffix(".moved"))  # gone from where its hash names it
        build.library.cache_clear()
        assert build.library() is None
    finally:
        build.library.cache_clear()


def test_large_weights_go_to_threaded_torch(lib: CDLL) -> None:
    """With several torch threads a large weight is left to torch's matmul; with one, the
    kernel takes it."""
    columns = 256
    weight = torch.randn(ops.LARGE_WEIGHT_BYTES // (4 * columns), columns)
    x = torch.randn(1, columns)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert ops.gemv(x, weight, lib) is None
        assert ops.gemv(x, weight[:8].contiguous(), lib) is not None
        torch.set_num_threads(1)
        out = ops.gemv(x, weight, lib)
        assert out is not None
        _close(out, x.double() @ weight.double().T, torch.float32)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [1, 37])
def test_mla_decode_matches_absorbed_attention(lib: CDLL, dtype: torch.dtype, length: int) -> None:
    generator = torch.Generator().manual_seed(length)
    heads, nope, rope, v_dim, rank, block = 3, 16, 8, 12, 40, 8
    kv = torch.randn(6 * block, rank + rope, generator=generator).to(dtype)
    kv_b = (torch.randn(heads * (nope + v_dim), rank, generator=generator) / 6).to(dtype)
    q_nope = torch.randn(1, heads, nope, generator=generator).to(dtype)
    q_pe = torch.randn(1, heads, rope, generator=generator).to(dtype)
    table = [4, 1, 5, 0, 2]  # blocks out of order; 37 tokens need all five
    out = ops.mla_decode(q_nope, q_pe, kv, table, length, block, kv_b, v_dim, 0.3, lib)
    assert out is not None and out.shape == (1, heads, v_dim)
    slots = [table[pos // block] * block + pos % block for pos in range(length)]
    latents = kv[slots][None]
    per_head = kv_b.view(heads, nope + v_dim, rank)
    expected = attention_absorbed(
        q_nope.double(), q_pe.double(), latents.double(), torch.ones(1, length, dtype=torch.bool),
        per_head[:, :nope].double(), per_head[:, nope:].double(), 0.3,
    )  # fmt: skip
    _close(out, expected, dtype)


def test_mla_decode_rejects_a_table_outside_the_cache(lib: CDLL) -> None:
    kv, kv_b = torch.randn(16, 12), torch.randn(2 * 10, 8)
    q_nope, q_pe = torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="outside"):
        ops.mla_decode(q_nope, q_pe, kv, [0, 2], 12, 8, kv_b, 6, 1.0, lib)
