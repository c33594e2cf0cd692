"""What one rank of the parallel engine holds and sends: weights under ``layout``, and the
bytes it puts into collectives per decode step, both counted from the config's shapes.

Weights follow ``backend.parallel.layout`` exactly (one layer of each kind built on the meta
device, its tensors sliced as the loader slices them, times the number of such layers): FP8
linears whose slice is block-aligned stay one byte plus their scale grid, others count at the
compute dtype (dequantized at load). Rank 0 also holds the MTP layer's whole vocabulary head.

Communication per decode step, per rank, as ``backend.parallel`` sends it (T new tokens: S
sequences times 1 + drafts; D hidden; e bytes per activation; N ranks):
  - all-reduce (ring: each rank sends 2 (N - 1) / N of the tensor) of T x D after the
    embedding, each attention and each FFN of the decoder layers (and of the MTP layer when
    drafting);
  - with expert parallel, per MoE layer: split counts (N - 1) x 8 bytes, then the dispatched
    rows, their expert ids and the returned rows. A rank's T / N tokens pick k experts each;
    under uniform routing (N - 1) / N of those pairs leave the rank, each way;
  - rank 0 to the workers: the command (3 x 8 bytes) and the plan (8 x (2 + 3 T + 3 S + the
    block-table entries)) per call, the sampling rows S x D to each worker, and the workers'
    vocabulary shares of the logits (S x V / N x 4 bytes) back to rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.model import fp8
from backend.model.config import ModelConfig
from backend.model.model import DecoderLayer, MTPLayer
from backend.parallel.layout import Layout, slice_for

_FP32_NAMES = ("e_score_correction_bias",)


def rank_weight_bytes(
    config: ModelConfig, layout: Layout, *, dtype: torch.dtype, fp8_resident: bool = True,
    include_mtp: bool = True,
) -> int:  # fmt: skip
    """Bytes of the weights rank ``layout.rank`` holds."""
    width = torch.empty((), dtype=dtype).element_size()
    quantized = fp8_resident and config.quantization is not None
    block = config.quantization.weight_block_size if config.quantization else fp8.DEFAULT_BLOCK
    total = 0

    def add(name: str, shape: tuple[int, ...], copies: int) -> None:
        nonlocal total
        piece = slice_for(name, config, layout)
        rows_cols = list(shape)
        aligned = True
        if piece.dim is not None:
            rows_cols[piece.dim] = piece.stop - piece.start
            aligned = piece.start % block[piece.dim] == 0 and (
                piece.stop % block[piece.dim] == 0 or piece.stop == shape[piece.dim]
            )
        numel = int(torch.Size(rows_cols).numel())
        if piece.zero:
            numel = int(torch.Size(shape).numel())  # held (as zeros) all the same
        if quantized and fp8.is_fp8_linear(name) and aligned:
            grid = fp8.scale_shape((rows_cols[0], rows_cols[1]), block)
            total += copies * (numel + grid[0] * grid[1] * 4)
        elif name.endswith(_FP32_NAMES):
            total += copies * 4 * numel
        else:
            total += copies * width * numel

    vocab = (config.vocab_size, config.hidden_size)
    add("model.embed_tokens.weight", vocab, 1)
    add("lm_head.weight", vocab, 1)
    add("model.norm.weight", (config.hidden_size,), 1)
    experts = len(layout.local_experts(config))
    for index, layer, copies in _layer_kinds(config, include_mtp):
        for name, tensor in layer.state_dict().items():
            full = f"model.layers.{index}.{name}"
            if ".mlp.experts." in full:
                expert = int(name.split(".")[2])
                if expert >= experts:
                    continue
            add(full, tuple(tensor.shape), copies)
    return total


def _layer_kinds(config: ModelConfig, include_mtp: bool) -> list[tuple[int, DecoderLayer, int]]:
    """(a layer index, that layer built on meta, how many layers are like it)."""
    dense = [i for i in range(config.num_hidden_layers) if not config.is_moe_layer(i)]
    moe = [i for i in range(config.num_hidden_layers) if config.is_moe_layer(i)]
    kinds: list[tuple[int, DecoderLayer, int]] = []
    with torch.device("meta"):
        for layers in (dense, moe):
            if layers:
                layer = DecoderLayer(config, layers[0], torch.bfloat16)
                kinds.append((layers[0], layer, len(layers)))
        mtp = config.num_nextn_predict_layers if include_mtp else 0
        if mtp:
            index = config.num_hidden_layers
            kinds.append((index, MTPLayer(config, index, torch.bfloat16), mtp))
    return kinds


@dataclass(frozen=True)
class StepBytes:
    """Bytes one rank sends in one decode step, by kind (``total`` sums them)."""

    all_reduce: int
    all_to_all: int
    plan: int
    logits: int

    @property
    def total(self) -> int:
        return self.all_reduce + self.all_to_all + self.plan + self.logits


def decode_step_bytes(
    config: ModelConfig,
    world: int,
    *,
    expert_parallel: bool,
    num_seqs: int,
    drafts: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    rank: int = 0,
    context_len: int = 1,
    block_size: int = 64,
) -> StepBytes:
    """Analytic bytes rank ``rank`` sends in a decode step of ``num_seqs`` sequences, each with
    ``drafts`` draft tokens verified (and, with drafts, the MTP layer run over the step)."""
    if world == 1:
        return StepBytes(0, 0, 0, 0)
    width = torch.empty((), dtype=dtype).element_size()
    tokens = num_seqs * (1 + drafts)
    row = tokens * config.hidden_size * width
    layers = config.num_hidden_layers
    reduces = 1 + 2 * layers + (3 if drafts else 0)  # embedding, attention + FFN per layer
    all_reduce = reduces * (2 * (world - 1) * row // world)
    all_to_all = 0
    if expert_parallel:
        moe_layers = len(config.moe_layer_indices) + (1 if drafts else 0)
        pairs = tokens * config.moe.num_experts_per_tok / world * (world - 1) / world
        per_layer = (world - 1) * 8 + pairs * (2 * config.hidden_size * width + 8)
        all_to_all = round(moe_layers * per_layer)
    plan = logits = 0
    if rank == 0:
        table = num_seqs * -(-(context_len + drafts) // block_size)
        commands = 2 if drafts else 1  # the step (and the draft over it)
        plan_entries = 2 + 3 * tokens + 3 * num_seqs + table
        # headers; the step's plan and its sampled rows' numbers (all T rows of a decode step:
        # the workers hold their hidden states); with drafts, each row's next token id
        per_worker = (
            commands * 3 * 8 + plan_entries * 8 + tokens * 8 + (tokens * 8 if drafts else 0)
        )
        plan = (world - 1) * per_worker
    else:
        logits = tokens * -(-config.vocab_size // world) * 4
    return StepBytes(all_reduce, all_to_all, plan, logits)


@dataclass(frozen=True)
class LayoutAdvice:
    """A recommended layout for ``nodes`` x ``gpus_per_node`` GPUs and what it leaves."""

    nodes: int
    gpus_per_node: int
    expert_parallel: bool
    root_weight_bytes: int  # rank 0 (it also holds the MTP head the drafter reads)
    worker_weight_bytes: int
    cache_tokens: int  # per GPU, and the cluster's total: every GPU caches every latent
    steps: dict[int, StepBytes]  # batch size -> bytes rank 0 sends per decode step
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
    batches: tuple[int, ...] = (1, 32),
) -> LayoutAdvice:
    """Tensor parallel over every GPU, expert parallel when the routed experts split evenly
    (each expert's GEMMs stay whole and the expert weights, most of DeepSeek's bytes, are not
    duplicated). ``other_bytes``: activations, logits and reserve per GPU."""
    world = nodes * gpus_per_node
    expert_parallel = world > 1 and config.moe.n_routed_experts % world == 0
    Layout(0, world, expert_parallel).check(config)
    sizes = [
        rank_weight_bytes(
            config, Layout(rank, world, expert_parallel), dtype=dtype,
            fp8_resident=fp8_resident, include_mtp=include_mtp,
        )
        for rank in range(min(world, 2))
    ]  # fmt: skip
    per_token = config.cache_bytes_per_token(dtype, include_mtp=include_mtp)
    left = gpu_memory_bytes - max(sizes) - other_bytes
    tokens = max(0, left) // per_token // block_size * block_size
    steps = {
        batch: decode_step_bytes(
            config, world, expert_parallel=expert_parallel, num_seqs=batch, dtype=dtype,
            context_len=1024, block_size=block_size,
        )
        for batch in batches
    }  # fmt: skip
    return LayoutAdvice(
        nodes, gpus_per_node, expert_parallel, sizes[0], sizes[-1], tokens, steps,
        tokens >= block_size,
    )  # fmt: skip


def format_advice(advice: LayoutAdvice, config: ModelConfig) -> str:
    world, moe = advice.world, config.moe
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
    lines = [
        f"parallel layout over {advice.nodes} x {advice.gpus_per_node} GPUs: [engine] "
        f"tensor_parallel = {world}, expert_parallel = {str(advice.expert_parallel).lower()}"
        + local,
        f"  attention: {config.mla.num_heads // world} of {config.mla.num_heads} heads per GPU;"
        " the latent projections and the latent cache whole on every GPU",
        f"  {experts}; dense MLPs, shared experts and the vocabulary 1/{world} per GPU",
        f"  weights per GPU: {advice.root_weight_bytes / 1e9:,.1f} GB on rank 0 (with the MTP "
        f"head the drafter reads), {advice.worker_weight_bytes / 1e9:,.1f} GB on the others",
        f"  tokens of latent cache per GPU (the whole cluster's: every GPU caches every "
        f"token): {advice.cache_tokens:,}",
    ]
    for batch, step in advice.steps.items():
        lines.append(
            f"  bytes rank 0 sends per decode step at batch {batch}: {step.total / 1e6:,.2f} MB"
            f" (all-reduce {step.all_reduce / 1e6:,.2f}, all-to-all {step.all_to_all / 1e6:,.2f},"
            f" plan and sampling rows {step.plan / 1e6:,.3f})"
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
