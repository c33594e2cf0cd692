"""Compile every Triton kernel configuration the wrappers launch on a GPU, without one.

    python -m backend.kernels.compile_check [--arch 90]

The CPU tests run the kernels under Triton's interpreter, which upcasts every dot to fp32: the
CUDA path's bf16 and FP8 dots and its tile sizes are never compiled there. This compiles them
ahead of time for a CUDA architecture (Hopper, sm_90, by default) with the ptxas Triton ships,
at DeepSeek-V3.1's widths and with the tiles each wrapper chooses for decode and prefill, and
prints one line per configuration. Exit status: the number that failed. Run it without
``TRITON_INTERPRET`` (the kernels must be defined as compiled ones).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from backend.kernels import _fp8_gemm_triton as gemm
from backend.kernels import _fused_moe_triton as moe
from backend.kernels import _mla_decode_triton as mla
from backend.kernels import _small_triton as small
from backend.kernels.fp8_gemm import choose_tiles as gemm_tiles
from backend.kernels.fused_moe import choose_tiles as moe_tiles
from backend.kernels.mla_decode import _padded
from backend.kernels.mla_decode import choose_tiles as mla_tiles
from backend.kernels.small_ops import NUM_WARPS, SILU_BLOCK, triton_width

Config = tuple[str, Any, dict[str, str], dict[str, Any], int, int]  # name, kernel, types, ...
INT = "i32"
HEADS, LORA, ROPE, EXPERTS, TOP_K = 128, 512, 64, 256, 8
HIDDEN, Q_LORA, GROUPS, TOPK_GROUPS = 7168, 1536, 8, 4


def configurations() -> Iterator[Config]:
    """(name, kernel, runtime argument types, constexprs, warps, stages) as the wrappers launch
    them on CUDA: bf16 activations, e4m3 weights, fp32 scales and accumulators."""
    yield (
        "act_quant", gemm.act_quant_kernel,
        {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32"},
        {"GROUP": 128, "FP8_MAX": 448.0}, 4, 3,
    )  # fmt: skip
    for rows in (1, 64, 4096):
        gemm_t = gemm_tiles(rows)
        for w8a8 in (False, True):
            yield (
                f"fp8_gemm rows={rows} {'w8a8' if w8a8 else 'weight-only'}", gemm.fp8_gemm_kernel,
                {"a_ptr": "*fp8e4nv" if w8a8 else "*bf16", "as_ptr": "*fp32",
                 "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "c_ptr": "*bf16"},
                {"ACT_SCALED": w8a8, "UPCAST": False, "SCALE_N": 128, "SCALE_K": 128,
                 "BLOCK_M": gemm_t.block_m, "BLOCK_N": gemm_t.block_n, "BLOCK_K": gemm_t.block_k},
                gemm_t.num_warps, gemm_t.num_stages,
            )  # fmt: skip
    for tokens in (1, 4096):
        moe_t = moe_tiles(tokens * TOP_K, EXPERTS)
        for fp8 in (False, True):
            weights = "*fp8e4nv" if fp8 else "*bf16"
            common = {"FP8": fp8, "UPCAST": False, "SCALE_N": 128, "SCALE_K": 128,
                      "BLOCK_M": moe_t.block_m, "BLOCK_N": moe_t.block_n,
                      "BLOCK_K": moe_t.block_k}  # fmt: skip
            pointers = {"w_ptr": weights, "s_ptr": "*fp32", "pair_ptr": "*i32",
                        "block_expert_ptr": "*i32"}  # fmt: skip
            yield (
                f"moe gate_up tokens={tokens} fp8={fp8}", moe.gate_up_kernel,
                {"x_ptr": "*bf16", "h_ptr": "*bf16", **pointers},
                {"TOP_K": TOP_K, **common}, moe_t.num_warps, moe_t.num_stages,
            )  # fmt: skip
            yield (
                f"moe down tokens={tokens} fp8={fp8}", moe.down_kernel,
                {"h_ptr": "*bf16", "out_ptr": "*fp32", "route_ptr": "*fp32", **pointers},
                common, moe_t.num_warps, moe_t.num_stages,
            )  # fmt: skip
    for width in (HIDDEN, Q_LORA, LORA):  # the layer norms, the latent's among them
        for residual in (False, True):
            yield (
                f"add_rms_norm width={width} residual={residual}", small.add_rms_norm_kernel,
                {"x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16",
                 "h_ptr": "*bf16", "eps": "fp32"},
                {"HAS_RESIDUAL": residual, "BLOCK_D": triton_width(width)}, NUM_WARPS, 1,
            )  # fmt: skip
    yield (
        "silu_mul", small.silu_mul_kernel,
        {"g_ptr": "*bf16", "u_ptr": "*bf16", "out_ptr": "*bf16"}, {"BLOCK_D": SILU_BLOCK},
        NUM_WARPS, 1,
    )  # fmt: skip
    yield (
        "latent_write", small.latent_write_kernel,
        {"kv_ptr": "*bf16", "w_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
         "slot_ptr": "*i64", "cache_ptr": "*bf16", "eps": "fp32"},
        {"LORA": LORA, "HALF_ROPE": ROPE // 2, "LORA_PAD": triton_width(LORA),
         "HALF_PAD": triton_width(ROPE // 2)},
        NUM_WARPS, 1,
    )  # fmt: skip
    yield (
        "route", small.route_kernel,
        {"logits_ptr": "*fp32", "bias_ptr": "*fp32", "w_ptr": "*fp32", "id_ptr": "*i64",
         "scaling": "fp32"},
        {"N_GROUP": GROUPS, "PER_GROUP": EXPERTS // GROUPS, "TOPK_GROUP": TOPK_GROUPS,
         "TOP_K": TOP_K, "TOP_K_PAD": triton_width(TOP_K), "GROUPED": True, "NORM": True},
        NUM_WARPS, 1,
    )  # fmt: skip
    for tokens, splits in ((1, 16), (64, 1), (64, 4)):
        mla_t = mla_tiles(tokens, HEADS)
        yield (
            f"mla decode tokens={tokens} splits={splits}", mla.mla_decode_kernel,
            {"q_ptr": "*bf16", "qpe_ptr": "*bf16", "kv_ptr": "*bf16", "table_ptr": "*i32",
             "seq_ptr": "*i32", "len_ptr": "*i32", "out_ptr": "*fp32", "lse_ptr": "*fp32",
             "scale": "fp32"},
            {"LORA": LORA, "ROPE": ROPE, "LORA_PAD": _padded(LORA), "ROPE_PAD": _padded(ROPE),
             "PAGE": 64, "NUM_SPLITS": splits, "BLOCK_H": mla_t.block_h,
             "BLOCK_N": mla_t.block_n, "UPCAST": False},
            mla_t.num_warps, mla_t.num_stages,
        )  # fmt: skip


def compile_one(config: Config, target: GPUTarget) -> str | None:
    """None when the configuration compiles, else why not. Arguments not named in the types
    are i32 (sizes and strides)."""
    _, kernel, types, constexprs, warps, stages = config
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: "constexpr" if n in constexprs else types.get(n, INT) for n in names}
    fixed = {(names.index(n),): value for n, value in constexprs.items()}
    source = ASTSource(fn=kernel, signature=signature, constexprs=fixed)
    try:
        triton.compile(source, target=target, options={"num_warps": warps, "num_stages": stages})
    except Exception as exc:  # a compiler error of any kind is this configuration's result
        return f"{type(exc).__name__}: {str(exc)[:2000]}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10")
    args = parser.parse_args(argv)
    if not isinstance(gemm.fp8_gemm_kernel, triton.JITFunction):
        print("the kernels are interpreted: run without TRITON_INTERPRET", file=sys.stderr)
        return 2
    target = GPUTarget("cuda", args.arch, 32)
    failed = 0
    for config in configurations():
        error = compile_one(config, target)
        failed += error is not None
        print(f"{'FAILED' if error else 'ok    '} sm_{args.arch} {config[0]}", error or "")
    print(f"{failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(main())
