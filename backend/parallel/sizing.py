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
    drafting); with data-parallel attention, each attention's rows join instead by an
    all-gather of every rank's rows, padded to the busiest rank's B (ring: each rank sends
    (N - 1) x B x D), where that is fewer bytes (``gather_is_cheaper``: N x B < 2 T);
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
    include_mtp: bool = True, part: str = "",
) -> int:  # fmt: skip
    """Bytes of the weights rank ``layout.rank`` holds (only those whose name contains
    ``part``, when given)."""
    width = torch.empty((), dtype=dtype).element_size()
    quantized = fp8_resident and config.quantization is not None
    block = config.quantization.weight_block_size if config.quantization else fp8.DEFAULT_BLOCK
    total = 0

    def add(name: str, shape: tuple[int, ...], copies: int) -> None:
        nonlocal total
        if part not in name:
            return
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


def gather_is_cheaper(rows: int, busiest: int, world: int) -> bool:
    """Whether ``world`` ranks join a step's ``rows`` attention rows, ``busiest`` of them on
    one rank, in fewer bytes by an all-gather padded to ``busiest`` rows ((N - 1) x B rows a
    rank) than by a ring all-reduce of all of them (2 (N - 1) / N x T)."""
    return world * busiest < 2 * rows


@dataclass(frozen=True)
class StepBytes:
    """Bytes one rank sends in one decode step, by kind (``total`` sums them)."""

    all_reduce: int
    all_to_all: int
    plan: int
    logits: int
    all_gather: int = 0

    @property
    def total(self) -> int:
        return self.all_reduce + self.all_gather + self.all_to_all + self.plan + self.logits


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
    attention_seqs: int | None = None,
) -> StepBytes:
    """Analytic bytes rank ``rank`` sends in a decode step of ``num_seqs`` sequences, each with
    ``drafts`` draft tokens verified (and, with drafts, the MTP layer run over the step);
    ``attention_seqs``: with data-parallel attention, the sequences of the busiest rank."""
    if world == 1:
        return StepBytes(0, 0, 0, 0)
    width = torch.empty((), dtype=dtype).element_size()
    tokens = num_seqs * (1 + drafts)
    row = tokens * config.hidden_size * width
    layers = config.num_hidden_layers
    reduces = 1 + 2 * layers + (3 if drafts else 0)  # embedding, attention + FFN per layer
    all_gather = 0
    if attention_seqs is not None:
        busiest = attention_seqs * (1 + drafts)
        if gather_is_cheaper(tokens, busiest, world):
            joins = layers + (1 if drafts else 0)  # the attentions, the MTP layer's included
            reduces -= joins
            all_gather = joins * (world - 1) * busiest * config.hidden_size * width
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
    return StepBytes(all_reduce, all_to_all, plan, logits, all_gather)


@dataclass(frozen=True)
class AttentionReads:
    """Bytes one rank reads for attention in one decode step, by kind."""

    weights: int
    latents: int

    @property
    def total(self) -> int:
        return self.weights + self.latents


def attention_read_bytes(
    config: ModelConfig, layout: Layout, *, num_seqs: int, context_len: int,
    dtype: torch.dtype, fp8_resident: bool = True,
) -> AttentionReads:  # fmt: skip
    """What the busiest rank reads for attention in a decode step of ``num_seqs`` sequences
    of ``context_len`` tokens: its attention weights (the decoder layers') and the cached
    latents of the sequences it attends to, every decoder layer's row of each token (all
    sequences under tensor parallel, where every rank reads every latent for its heads; its
    ceil(S / N) under data-parallel attention)."""
    weights = rank_weight_bytes(
        config, layout, dtype=dtype, fp8_resident=fp8_resident, include_mtp=False,
        part=".self_attn.",
    )  # fmt: skip
    seqs = -(-num_seqs // layout.world) if layout.data_parallel_attention else num_seqs
    return AttentionReads(weights, seqs * context_len * config.cache_bytes_per_token(dtype))
