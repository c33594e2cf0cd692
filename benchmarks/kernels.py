"""Each Triton kernel's time, bandwidth and FLOP rate against the H200's limits and the torch path.

``python benchmarks/kernels.py`` on a CUDA GPU (DeepSeek-V3.1's widths: hidden 7168, 128 heads,
q_lora_rank 1536, kv_lora_rank 512, rope 64, 256 experts of 2048 with top-8), then a real-shaped
slice of the model (``benchmarks/kernel_slice.py``). ``--smoke`` runs tiny widths on the CPU
under Triton's interpreter, to check the script itself; its figures mean nothing.

The fused small kernels (RMSNorm with the residual add, SiLU x up, the latent's norm and
rotation written into the cache, the router's top-k) beside the torch ops they replace: a
kernel is kept where it is faster than those.

Targets: MLA decode at batch 64 over 4K contexts >= 70% of HBM bandwidth; fused MoE
decode >= 60% of bandwidth; FP8 GEMM at prefill sizes >= 60% of FP8 peak.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernel_shapes import (  # noqa: E402
    H200_BF16_FLOPS,
    H200_FP8_FLOPS,
    REAL,
    SMOKE,
    Row,
    Widths,
    measure,
    random_experts,
)


def bench_fp8_gemm(w: Widths, device: torch.device, rows: list[int]) -> list[Row]:
    from backend.kernels import fp8_gemm
    from backend.model import fp8

    linears = {  # name: (in, out)
        "q_b_proj": (w.q_lora_rank, w.heads * (w.nope + w.rope)),
        "o_proj": (w.heads * w.v_head, w.hidden),
        "dense up": (w.hidden, w.dense_inter),
        "dense down": (w.dense_inter, w.hidden),
    }
    act = torch.bfloat16 if device.type == "cuda" else torch.float32
    out: list[Row] = []
    for name, (k, n) in linears.items():
        weight = torch.randn(n, k, device=device).to(fp8.FP8_DTYPE)
        scale = torch.rand(fp8.scale_shape((n, k)), device=device) / k
        dense = fp8.dequantize(weight, scale, dtype=act)
        for m in rows:
            x = torch.randn(m, k, device=device, dtype=act)
            torch_s = measure(lambda x=x, dense=dense: F.linear(x, dense), device)
            weight_bytes = n * k + scale.numel() * 4
            io_bytes = (m * k + m * n) * x.element_size()
            for quantize in (False, True):
                seconds = measure(
                    lambda x=x, weight=weight, scale=scale, q=quantize: fp8_gemm.fp8_linear(
                        x, weight, scale, quantize_activations=q
                    ),
                    device,
                )
                mode = "w8a8" if quantize else "w-only"
                out.append(
                    Row(
                        "fp8 gemm",
                        f"{name} {mode} M={m} {k}->{n}",
                        seconds,
                        weight_bytes + io_bytes,
                        2.0 * m * n * k,
                        H200_FP8_FLOPS if quantize else H200_BF16_FLOPS,
                        torch_s,
                    )
                )
    return out


def bench_mla_decode(w: Widths, device: torch.device, cases: list[tuple[int, int]]) -> list[Row]:
    from backend.kernels import mla_decode
    from backend.model.cache import PagedLatentCache

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    latent = w.kv_lora_rank + w.rope
    scale = (w.nope + w.rope) ** -0.5
    out: list[Row] = []
    for batch, context in cases:
        blocks_per_seq = -(-context // w.page)
        cache = PagedLatentCache(1, batch * blocks_per_seq, w.page, latent, dtype, device)
        cache.kv.normal_()
        order = torch.randperm(batch * blocks_per_seq).tolist()  # scattered blocks
        tables = [order[i * blocks_per_seq : (i + 1) * blocks_per_seq] for i in range(batch)]
        q_nope = torch.randn(batch, w.heads, w.nope, device=device, dtype=dtype)
        q_pe = torch.randn(batch, w.heads, w.rope, device=device, dtype=dtype)
        w_uk = torch.randn(w.heads, w.nope, w.kv_lora_rank, device=device, dtype=dtype) / 20
        w_uv = torch.randn(w.heads, w.v_head, w.kv_lora_rank, device=device, dtype=dtype) / 20
        q_latent = torch.einsum("thn,hnr->thr", q_nope, w_uk).contiguous()
        token_seq, token_len = mla_decode.token_layout([1] * batch, [context] * batch, device)
        block_tables = mla_decode.block_table_tensor(tables, device)
        kv = cache.kv[0]

        kernel = partial(
            mla_decode.mla_decode, q_latent, q_pe, kv, block_tables, token_seq, token_len,
            scale, w.page,
        )  # fmt: skip
        path = partial(
            mla_decode.absorbed_attention, q_nope, q_pe, kv, block_tables, token_seq, token_len,
            w_uk, w_uv, scale, w.page,
        )  # fmt: skip
        torch_path = partial(
            _torch_absorbed, cache, tables, [context] * batch, q_nope, q_pe, w_uk, w_uv, scale
        )
        read = batch * context * latent * cache.kv.element_size()
        io = batch * w.heads * (latent * 2 + w.kv_lora_rank * 4)
        flops = 2.0 * batch * w.heads * context * (latent + w.kv_lora_rank)
        case = f"batch {batch} context {context}"
        out.append(
            Row("mla kernel", case, measure(kernel, device), read + io, flops, H200_BF16_FLOPS)
        )
        out.append(
            Row(
                "mla path",  # W_UK in, the kernel, W_UV out; vs gather + attention_absorbed
                case,
                measure(path, device),
                read + io,
                flops,
                H200_BF16_FLOPS,
                measure(torch_path, device),
            )
        )
    return out


def _torch_absorbed(cache, tables, lens, q_nope, q_pe, w_uk, w_uv, scale):  # type: ignore[no-untyped-def]
    """The model's torch decode path: gather the padded latents, attend in fp32."""
    from backend.model.mla import attention_absorbed

    latents, valid = cache.gather_batch(0, tables, lens)
    return attention_absorbed(q_nope, q_pe, latents, valid, w_uk, w_uv, scale)


def _torch_moe(x, w13, w2, weights, ids):  # type: ignore[no-untyped-def]
    """The model's torch path: one expert at a time over the tokens it received."""
    inter = w2.shape[2]
    out = torch.zeros_like(x)
    for expert in ids.unique().tolist():
        tokens, slots = (ids == expert).nonzero(as_tuple=True)
        gate_up = x[tokens] @ w13[expert].t()
        hidden = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        routed = (hidden @ w2[expert].t()) * weights[tokens, slots, None].to(x.dtype)
        out.index_add_(0, tokens, routed)
    return out


def bench_fused_moe(w: Widths, device: torch.device, token_counts: list[int]) -> list[Row]:
    from backend.kernels import fused_moe

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bf16, quantized = random_experts(w, device, dtype)
    w13, w2 = bf16.w13, bf16.w2
    expert_params = 3 * w.hidden * w.moe_inter
    out: list[Row] = []
    for tokens in token_counts:
        x = torch.randn(tokens, w.hidden, device=device, dtype=dtype)
        scores = torch.rand(tokens, w.experts, device=device)
        weights, ids = scores.topk(w.top_k, dim=-1)
        hit = int(ids.unique().numel())
        flops = 2.0 * tokens * w.top_k * expert_params
        torch_s = measure(lambda x=x, wt=weights, i=ids: _torch_moe(x, w13, w2, wt, i), device)
        for label, experts, width in (("bf16", bf16, 2), ("fp8", quantized, 1)):
            seconds = measure(
                lambda x=x, e=experts, wt=weights, i=ids: fused_moe.fused_moe(x, e, wt, i), device
            )
            out.append(
                Row(
                    "fused moe",
                    f"{label} T={tokens} ({hit} experts hit)",
                    seconds,
                    hit * expert_params * width + 2 * tokens * w.hidden * x.element_size(),
                    flops,
                    H200_BF16_FLOPS,
                    torch_s if label == "bf16" else None,
                )
            )
    return out


def bench_small_ops(w: Widths, device: torch.device, token_counts: list[int]) -> list[Row]:
    """The fused small kernels against the unfused torch ops they replace (their references):
    RMSNorm with the residual add at the hidden width, SiLU x up at the dense and the expert
    intermediate widths. Bytes: what the fused kernel must read and write."""
    from backend.kernels import small_ops
    from backend.model.config import MoEConfig
    from backend.model.moe import route_noaux_tc

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = torch.empty((), dtype=dtype).element_size()
    weight = torch.ones(w.hidden, device=device, dtype=dtype)
    groups = next(g for g in (8, 4, 2, 1) if w.experts % g == 0 and w.experts // g >= 2)
    moe = MoEConfig(w.experts, 0, w.top_k, w.moe_inter, groups, max(1, groups // 2), 2.5,
                    True, 0)  # fmt: skip
    bias = torch.randn(w.experts, device=device) * 0.1
    out: list[Row] = []
    for tokens in token_counts:
        x = torch.randn(tokens, w.hidden, device=device, dtype=dtype)
        r = torch.randn_like(x)
        fused = measure(lambda x=x, r=r: small_ops.add_rms_norm(x, weight, 1e-6, r), device)
        unfused = measure(
            lambda x=x, r=r: small_ops.add_rms_norm_reference(x, weight, 1e-6, r), device
        )
        flops = 5.0 * tokens * w.hidden
        moved = 4 * tokens * w.hidden * size
        out.append(Row("add rms norm", f"T={tokens} D={w.hidden}", fused, moved, flops,
                       H200_BF16_FLOPS, unfused))  # fmt: skip
        for inter in (w.dense_inter, w.moe_inter):
            g = torch.randn(tokens, inter, device=device, dtype=dtype)
            u = torch.randn_like(g)
            fused = measure(lambda g=g, u=u: small_ops.silu_mul(g, u), device)
            unfused = measure(lambda g=g, u=u: small_ops.silu_mul_reference(g, u), device)
            out.append(Row("silu mul", f"T={tokens} D={inter}", fused, 3 * tokens * inter * size,
                           6.0 * tokens * inter, H200_BF16_FLOPS, unfused))  # fmt: skip
        latent = w.kv_lora_rank + w.rope
        kv = torch.randn(tokens, latent, device=device, dtype=dtype)
        norm = torch.ones(w.kv_lora_rank, device=device, dtype=dtype)
        angles = torch.rand(tokens, w.rope // 2, device=device)
        cos, sin = angles.cos(), angles.sin()
        cache = torch.zeros(2 * tokens, latent, device=device, dtype=dtype)
        slots = torch.randperm(2 * tokens, device=device)[:tokens]
        args = (kv, norm, 1e-6, cos, sin, cache, slots)
        fused = measure(lambda a=args: small_ops.write_latents(*a), device)
        unfused = measure(lambda a=args: small_ops.write_latents_reference(*a), device)
        out.append(Row("latent write", f"T={tokens} D={latent}", fused, 2 * tokens * latent * size,
                       5.0 * tokens * latent, H200_BF16_FLOPS, unfused))  # fmt: skip
        logits = torch.randn(tokens, w.experts, device=device)
        if small_ops.routable(w.experts, moe.n_group, moe.topk_group, moe.num_experts_per_tok):
            fused = measure(lambda lg=logits: small_ops.route(
                lg, bias, moe.n_group, moe.topk_group, moe.num_experts_per_tok, True, 2.5
            ), device)  # fmt: skip
            unfused = measure(lambda lg=logits: route_noaux_tc(lg, bias, moe), device)
            out.append(Row("route", f"T={tokens} E={w.experts}", fused, 4 * tokens * w.experts,
                           4.0 * tokens * w.experts, H200_BF16_FLOPS, unfused))  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny widths on CPU (interpreter)")
    parser.add_argument("--no-slice", action="store_true", help="skip the model slice")
    args = parser.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        device, widths = torch.device("cpu"), SMOKE
        rows, mla_cases, moe_tokens = [1, 32], [(2, 64)], [1, 16]
        small_tokens = [1, 16]
    elif torch.cuda.is_available():
        device, widths = torch.device("cuda"), REAL
        rows, mla_cases = [1, 16, 64, 256, 4096], [(1, 4096), (16, 4096), (64, 4096), (64, 16384)]
        moe_tokens = [1, 8, 64, 256, 4096]
        small_tokens = [1, 64, 4096]
        print(f"device: {torch.cuda.get_device_name()}")
    else:
        print("no CUDA GPU: run on an H200 (or pass --smoke to check the script)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    for row in bench_fp8_gemm(widths, device, rows):
        print(row.render())
    for row in bench_mla_decode(widths, device, mla_cases):
        print(row.render())
    for row in bench_fused_moe(widths, device, moe_tokens):
        print(row.render())
    if not args.no_slice:
        from benchmarks.kernel_slice import bench_slice

        for line in bench_slice(widths, device):
            print(line)
    # last: a step cut short by its time limit loses only these
    for row in bench_small_ops(widths, device, small_tokens):
        print(row.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
