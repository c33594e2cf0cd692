"""What a model needs per GPU before you try to serve it.

``python -m backend.plan --model DIR-or-config.json --gpus N [--nodes M] --gpu-memory-gb 141``

Prints the weights by precision (FP8 resident, or dequantized at load), the latent cache per
token, the activations of one step at the batch token budget, and how many tokens of latent
cache fit in what is left of each GPU. Weights are assumed sharded evenly over the GPUs (tensor
and expert parallelism); MLA's latent is shared by all heads, so under tensor parallelism every
GPU caches every token's latent and the tokens that fit one GPU are also the node's total.
Over more than one GPU it also prints the parallel engine's two layouts (``backend.parallel``),
tensor-parallel attention and data-parallel attention: the settings, the weights each GPU
holds, the latent-cache tokens per GPU and per node, the attention bytes the busiest GPU reads
per decode step and the bytes rank 0 puts into collectives per step, then what data-parallel
attention caches against tensor-parallel attention: per byte of cache (x the GPUs per node,
exactly) and per node after each layout's weights (less: every GPU holds the attention whole).
Sizes in decimal GB (10^9 bytes).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

import torch

from backend.engine.engine_config import EngineConfig
from backend.model.config import ConfigError, ModelConfig
from backend.model.dtypes import DTYPE_NAMES, torch_dtype
from backend.model.footprint import WeightBytes, activation_bytes_per_token, weight_bytes
from backend.parallel.advice import LayoutAdvice, compare, format_advice, format_gain, recommend

GB = 1e9
_DEFAULTS = EngineConfig()


@dataclass(frozen=True)
class Plan:
    gpus: int
    gpu_memory_bytes: int
    fp8_resident: bool
    weights: WeightBytes
    weights_dequantized: WeightBytes  # the same model with FP8 linears at the compute dtype
    weights_per_gpu: int
    cache_layers: int
    decoder_layers: int
    latent_dim: int
    cache_bytes_per_token: int
    max_batch_tokens: int
    activation_bytes: int
    logits_bytes: int
    reserve_bytes: int
    cache_bytes_per_gpu: int
    cache_tokens: int
    block_size: int

    @property
    def fits(self) -> bool:
        return self.cache_tokens >= self.block_size


def make_plan(
    config: ModelConfig,
    *,
    gpus: int,
    gpu_memory_bytes: int,
    dtype: torch.dtype = torch.bfloat16,
    fp8_resident: bool = True,
    include_mtp: bool = True,
    max_batch_tokens: int = _DEFAULTS.max_batch_tokens,
    max_num_seqs: int = _DEFAULTS.max_num_seqs,
    block_size: int = _DEFAULTS.block_size,
    reserve_bytes: int = int(4 * GB),
) -> Plan:
    if gpus < 1 or gpu_memory_bytes < 1:
        raise ValueError("gpus and gpu memory must be positive")
    weights = weight_bytes(config, fp8_resident=fp8_resident, dtype=dtype, include_mtp=include_mtp)
    dense = weight_bytes(config, fp8_resident=False, dtype=dtype, include_mtp=include_mtp)
    per_gpu = -(-weights.total_bytes // gpus)
    per_token = config.cache_bytes_per_token(dtype, include_mtp=include_mtp)
    activations = max_batch_tokens * activation_bytes_per_token(config, dtype)
    logits = max_num_seqs * config.vocab_size * 4 * 2  # fp32 logits and the sampler's copy
    left = gpu_memory_bytes - per_gpu - activations - logits - reserve_bytes
    tokens = max(0, left) // per_token // block_size * block_size
    return Plan(
        gpus=gpus,
        gpu_memory_bytes=gpu_memory_bytes,
        fp8_resident=fp8_resident and config.quantization is not None,
        weights=weights,
        weights_dequantized=dense,
        weights_per_gpu=per_gpu,
        cache_layers=config.num_cache_layers if include_mtp else config.num_hidden_layers,
        decoder_layers=config.num_hidden_layers,
        latent_dim=config.latent_dim,
        cache_bytes_per_token=per_token,
        max_batch_tokens=max_batch_tokens,
        activation_bytes=activations,
        logits_bytes=logits,
        reserve_bytes=reserve_bytes,
        cache_bytes_per_gpu=max(0, left),
        cache_tokens=tokens,
        block_size=block_size,
    )


def _gb(value: int) -> str:
    return f"{value / GB:,.1f} GB"


def _count(params: int) -> str:
    return f"{params / 1e9:,.2f} B" if params >= 1e8 else f"{params:,}"


def format_plan(plan: Plan, dtype_name: str) -> str:
    w = plan.weights
    by_precision = ", ".join(
        f"{name} {_count(w.params[name])} params = {_gb(size)}"
        for name, size in sorted(w.bytes.items())
    )
    width = plan.cache_bytes_per_token // (plan.cache_layers * plan.latent_dim)
    mode = "FP8 resident" if plan.fp8_resident else f"{dtype_name}"
    cache_line = (
        f"latent cache per token: {plan.cache_layers} layers x {plan.latent_dim} values x "
        f"{width} bytes = {plan.cache_bytes_per_token:,} bytes"
    )
    if plan.cache_layers != plan.decoder_layers:
        decoder = plan.decoder_layers * plan.latent_dim * width
        cache_line += f" (the {plan.decoder_layers} decoder layers {decoder:,}, the rest MTP)"
    lines = [
        f"weights ({mode}): {_count(w.total_params)} params, {_gb(w.total_bytes)} ({by_precision})",
        f"  dequantized to {dtype_name} instead: {_gb(plan.weights_dequantized.total_bytes)}",
        f"  per GPU over {plan.gpus}: {_gb(plan.weights_per_gpu)}",
        cache_line,
        f"activations at {plan.max_batch_tokens:,} batch tokens: {_gb(plan.activation_bytes)}"
        f" (+ logits {_gb(plan.logits_bytes)})",
        f"per GPU: {_gb(plan.gpu_memory_bytes)} - weights {_gb(plan.weights_per_gpu)} - "
        f"activations {_gb(plan.activation_bytes + plan.logits_bytes)} - reserve "
        f"{_gb(plan.reserve_bytes)} = {_gb(plan.cache_bytes_per_gpu)} for the latent cache",
        f"tokens of latent cache per GPU: {plan.cache_tokens:,} "
        f"({plan.cache_tokens // plan.block_size:,} blocks of {plan.block_size})",
        "fits" if plan.fits else "does NOT fit: not one block of cache is left",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backend.plan", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", required=True, help="checkpoint directory or config.json")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per node")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (the layout spans them)")
    parser.add_argument("--gpu-memory-gb", type=float, default=141.0)
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="bfloat16")
    parser.add_argument("--fp8-weights", choices=["resident", "dequantize"], default="resident")
    parser.add_argument("--max-batch-tokens", type=int, default=_DEFAULTS.max_batch_tokens)
    parser.add_argument("--max-num-seqs", type=int, default=_DEFAULTS.max_num_seqs)
    parser.add_argument("--block-size", type=int, default=_DEFAULTS.block_size)
    parser.add_argument("--reserve-gb", type=float, default=4.0, help="CUDA context, NCCL, slack")
    parser.add_argument(
        "--context-tokens", type=int, default=32768, help="per sequence, in the decode figures"
    )
    parser.add_argument("--no-mtp", action="store_true", help="leave the MTP layer out")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        config = ModelConfig.from_file(args.model)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"cannot read {args.model}: {exc}", file=sys.stderr)
        return 2
    if args.nodes < 1:
        print("--nodes must be positive", file=sys.stderr)
        return 2
    plan = make_plan(
        config,
        gpus=args.gpus * args.nodes,
        gpu_memory_bytes=int(args.gpu_memory_gb * GB),
        dtype=torch_dtype(args.dtype),
        fp8_resident=args.fp8_weights == "resident",
        include_mtp=not args.no_mtp,
        max_batch_tokens=args.max_batch_tokens,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
        reserve_bytes=int(args.reserve_gb * GB),
    )
    layouts: list[LayoutAdvice] = []
    if args.gpus * args.nodes > 1:
        layouts = [
            recommend(
                config,
                nodes=args.nodes,
                gpus_per_node=args.gpus,
                gpu_memory_bytes=plan.gpu_memory_bytes,
                other_bytes=plan.activation_bytes + plan.logits_bytes + plan.reserve_bytes,
                dtype=torch_dtype(args.dtype),
                fp8_resident=args.fp8_weights == "resident",
                include_mtp=not args.no_mtp,
                block_size=args.block_size,
                data_parallel_attention=dp,
                context_len=args.context_tokens,
            )
            for dp in (False, True)
        ]
    fits = plan.fits and (not layouts or any(advice.fits for advice in layouts))
    gain = compare(*layouts) if layouts else None
    if args.json:
        named = [{**asdict(advice), "world": advice.world} for advice in layouts]
        print(
            json.dumps(
                {
                    **asdict(plan),
                    "fits": fits,
                    "layout": named[0] if named else None,
                    "dp_layout": named[1] if named else None,
                    "dp_gain": asdict(gain) if gain else None,
                },
                indent=2,
            )
        )
    else:
        print(format_plan(plan, args.dtype))
        for advice in layouts:
            print(format_advice(advice, config))
        if gain is not None:
            print(format_gain(gain, *layouts))
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
