"""The parallel layouts ``python -m backend.plan`` recommends over several GPUs, and their text.

Two layouts over the same GPUs, each with expert parallel where the routed experts split
evenly (each expert's GEMMs stay whole and the expert weights, most of DeepSeek's bytes, are
not duplicated):
  - tensor parallel attention: the heads split, the latent cache whole on every GPU, so the
    node caches what one GPU holds and every GPU reads every sequence's latents;
  - data-parallel attention: the attention whole on every GPU (more weights per GPU), each
    GPU caching and reading only its own sequences' latents, so the node caches N GPUs' worth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.model.config import ModelConfig
from backend.parallel.layout import Layout
from backend.parallel.sizing import (
    AttentionReads,
    StepBytes,
    attention_read_bytes,
    decode_step_bytes,
    rank_weight_bytes,
)


@dataclass(frozen=True)
class LayoutAdvice:
    """A layout for ``nodes`` x ``gpus_per_node`` GPUs and what it leaves."""

    nodes: int
    gpus_per_node: int
    expert_parallel: bool
    data_parallel_attention: bool
    root_weight_bytes: int  # rank 0 (it also holds the MTP head the drafter reads)
    worker_weight_bytes: int
    cache_bytes: int  # per GPU, what the weights and other_bytes leave for the latent cache
    cache_tokens: int  # per GPU
    cache_tokens_per_node: int  # tensor parallel: one GPU's (every GPU caches every latent)
    cache_tokens_total: int  # the cluster's
    context_len: int  # of each sequence in the per-step figures
    steps: dict[int, StepBytes]  # batch size -> bytes rank 0 sends per decode step
    attention_reads: dict[int, AttentionReads]  # batch size -> what the busiest GPU reads
    fits: bool

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


def recommend(
    config: ModelConfig,
    *,
    nodes: int,
    gpus_per_node: int,
    gpu_memory_bytes: int,
    other_bytes: int,
    dtype: torch.dtype,
    fp8_resident: bool,
    include_mtp: bool,
    block_size: int,
    data_parallel_attention: bool = False,
    context_len: int = 32768,
    batches: tuple[int, ...] = (1, 32),
) -> LayoutAdvice:
    """The layout over every GPU; ``other_bytes``: activations, logits and reserve per GPU."""
    world = nodes * gpus_per_node
    expert_parallel = world > 1 and config.moe.n_routed_experts % world == 0
    dp = data_parallel_attention

    def layout(rank: int) -> Layout:
        return Layout(rank, world, expert_parallel, data_parallel_attention=dp)

    layout(0).check(config)
    sizes = [
        rank_weight_bytes(
            config, layout(rank), dtype=dtype, fp8_resident=fp8_resident, include_mtp=include_mtp
        )
        for rank in range(min(world, 2))
    ]
    per_token = config.cache_bytes_per_token(dtype, include_mtp=include_mtp)
    left = max(0, gpu_memory_bytes - max(sizes) - other_bytes)
    tokens = left // per_token // block_size * block_size
    steps = {
        batch: decode_step_bytes(
            config, world, expert_parallel=expert_parallel, num_seqs=batch, dtype=dtype,
            context_len=context_len, block_size=block_size,
            attention_seqs=-(-batch // world) if dp else None,
        )
        for batch in batches
    }  # fmt: skip
    reads = {
        batch: attention_read_bytes(
            config, layout(0), num_seqs=batch, context_len=context_len, dtype=dtype,
            fp8_resident=fp8_resident,
        )
        for batch in batches
    }  # fmt: skip
    return LayoutAdvice(
        nodes, gpus_per_node, expert_parallel, dp, sizes[0], sizes[-1], left, tokens,
        tokens * gpus_per_node if dp else tokens, tokens * world if dp else tokens,
        context_len, steps, reads, tokens >= block_size,
    )  # fmt: skip


def format_advice(advice: LayoutAdvice, config: ModelConfig) -> str:
    world, moe, heads = advice.world, config.moe, config.mla.num_heads
    dp = advice.data_parallel_attention
    local = (
        f", parallel_local_ranks = {advice.gpus_per_node} (other nodes: python -m "
        f"backend.parallel.worker)"
        if advice.nodes > 1
        else ""
    )
    experts = (
        f"routed experts: {moe.n_routed_experts // world} of {moe.n_routed_experts} whole per GPU"
        if advice.expert_parallel
        else f"routed experts: every expert's 1/{world} width on every GPU"
    )
    name = "data-parallel attention" if dp else "tensor-parallel attention"
    attention = (
        f"  attention: all {heads} heads on every GPU, each over its own sequences; each GPU "
        "caches only its sequences' latents"
        if dp
        else f"  attention: {heads // world} of {heads} heads per GPU; the latent projections "
        "and the latent cache whole on every GPU"
    )
    settings = f"tensor_parallel = {world}, expert_parallel = {str(advice.expert_parallel).lower()}"
    if dp:
        settings += ", data_parallel_attention = true"
    per_node = (
        f"{advice.cache_tokens:,} per GPU x {advice.gpus_per_node} = "
        f"{advice.cache_tokens_per_node:,} per node"
        if dp
        else f"{advice.cache_tokens:,} per GPU = per node (every GPU caches every token)"
    )
    if advice.nodes > 1:
        per_node += f", {advice.cache_tokens_total:,} in all"
    lines = [
        f"{name} over {advice.nodes} x {advice.gpus_per_node} GPUs: [engine] {settings}{local}",
        attention,
        f"  {experts}; dense MLPs, shared experts and the vocabulary 1/{world} per GPU",
        f"  weights per GPU: {advice.root_weight_bytes / 1e9:,.1f} GB on rank 0 (with the MTP "
        f"head the drafter reads), {advice.worker_weight_bytes / 1e9:,.1f} GB on the others",
        f"  tokens of latent cache: {per_node}",
    ]
    for batch, step in advice.steps.items():
        reads = advice.attention_reads[batch]
        lines.append(
            f"  decode step at batch {batch}, {advice.context_len:,} tokens each: attention reads"
            f" {reads.total / 1e9:,.2f} GB on the busiest GPU (latents {reads.latents / 1e9:,.2f},"
            f" weights {reads.weights / 1e9:,.2f}); rank 0 sends "
            f"{step.total / 1e6:,.2f} MB (all-reduce {step.all_reduce / 1e6:,.2f}, "
            + (f"all-gather {step.all_gather / 1e6:,.2f}, " if step.all_gather else "")
            + f"all-to-all {step.all_to_all / 1e6:,.2f}, plan and sampling rows "
            f"{step.plan / 1e6:,.3f})"
        )
    if advice.nodes > 1:
        share = (world - advice.gpus_per_node) / (world - 1)
        lines.append(
            f"  across nodes: {share:.0%} of the all-to-all rows (uniform routing) and the "
            f"ring all-reduce's {advice.nodes} node-crossing links of {world}"
        )
    lines.append(
        "layout fits"
        if advice.fits
        else "layout does NOT fit: the weights leave no block of latent cache on rank 0"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class CacheGain:
    """Data-parallel against tensor-parallel attention over the same GPUs, in cache tokens."""

    per_byte: float  # tokens per byte of latent cache: a token's latent on 1 GPU, not on all
    per_node: float  # tokens per node, after each layout's weights
    extra_weight_bytes: int  # per GPU (the busiest), that data-parallel attention holds more
    tp_cache_bytes: int  # per GPU, left for the cache
    dp_cache_bytes: int


def compare(tp: LayoutAdvice, dp: LayoutAdvice) -> CacheGain:
    """What `dp` caches against `tp`: per byte of cache, each of a node's GPUs holds distinct
    tokens under data-parallel attention and the same tokens under tensor-parallel attention
    (a gain of exactly the GPUs per node); per node, the attention's weights whole on every GPU
    take part of each GPU's cache."""
    copies_tp, copies_dp = tp.gpus_per_node, 1  # GPUs of a node holding a cached token's latent
    per_node = dp.cache_tokens_per_node / tp.cache_tokens_per_node if tp.cache_tokens else 0.0
    tp_weights = max(tp.root_weight_bytes, tp.worker_weight_bytes)
    dp_weights = max(dp.root_weight_bytes, dp.worker_weight_bytes)
    return CacheGain(
        copies_tp / copies_dp, per_node, dp_weights - tp_weights, tp.cache_bytes, dp.cache_bytes
    )


def format_gain(gain: CacheGain, tp: LayoutAdvice, dp: LayoutAdvice) -> str:
    gpus, nodes = tp.gpus_per_node, tp.nodes
    per_byte = (
        f"  x{gain.per_byte:g} per byte of cache: a cached token's latent sits on one of the "
        f"{gpus} GPUs of a node, not on every one of them"
    )
    if nodes > 1:
        per_byte += f" (x{gain.per_byte * nodes:g} over the {nodes} nodes)"
    if gain.per_node:
        per_node = (
            f"  x{gain.per_node:.2f} per node after weights ({dp.cache_tokens_per_node:,} "
            f"against {tp.cache_tokens_per_node:,} tokens)"
        )
    else:
        per_node = "  per node after weights: tensor-parallel attention leaves no cache"
    why = (
        f": the attention's weights whole on every GPU take {gain.extra_weight_bytes / 1e9:,.1f}"
        f" GB more of each GPU, leaving {gain.dp_cache_bytes / 1e9:,.1f} GB of cache per GPU "
        f"against {gain.tp_cache_bytes / 1e9:,.1f} GB"
    )
    return "\n".join(
        ["data-parallel against tensor-parallel attention, tokens of latent cache:", per_byte]
        + [per_node + why]
    )
