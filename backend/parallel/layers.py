"""The parallel modules: each computes its rank's share and ends in one collective.

Every rank holds the same hidden states [T, D] between layers (replicated activations):
attention over its heads, dense MLPs and shared experts over their intermediate slice, then one
all-reduce. Routed experts, when partitioned (expert parallel), are reached by all-to-all: each
rank dispatches its share of the tokens to the ranks holding their experts, those return the
expert outputs, and the weighted sums join the shared experts' partial sums in the layer's one
all-reduce. Routing is computed by every rank on the same hidden states with the same weights,
so every rank makes the same choice without exchanging it.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backend.kernels import support
from backend.kernels.fused_moe import fused_moe
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.config import ModelConfig
from backend.model.layers import SwiGLU
from backend.model.mla import MLA
from backend.model.moe import MoE
from backend.native import ops
from backend.parallel.group import RankGroup
from backend.parallel.layout import Layout


def local_heads_config(config: ModelConfig, layout: Layout) -> ModelConfig:
    """``config`` with this rank's share of the attention heads (all of them with
    data-parallel attention)."""
    heads = config.mla.num_heads // (1 if layout.data_parallel_attention else layout.world)
    return dataclasses.replace(config, mla=dataclasses.replace(config.mla, num_heads=heads))


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + weight.shape[0]) of the embedding; the others' rows by all-reduce."""

    def __init__(self, rows: int, dim: int, start: int, dtype: torch.dtype, group: RankGroup):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, dim, dtype=dtype))
        self.start = start
        self.group = group

    def forward(self, ids: Tensor) -> Tensor:  # [T] -> [T, D]
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.clamp(0, max(0, self.weight.shape[0] - 1)), self.weight)
        return self.group.all_reduce(out.masked_fill(outside[:, None], 0))


class ParallelMLA(MLA):
    """MLA over this rank's heads (a config with num_heads / world); o_proj's partial sums are
    all-reduced. Writes the whole latent row into this rank's cache, as every rank does."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, group: RankGroup) -> None:
        super().__init__(config, dtype)
        self.group = group
        self.latent_bytes_read = 0  # cached latents this rank's attention read (benchmarks)
        self.seconds = 0.0  # wall time of its attention before the all-reduce (benchmarks)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        batch: ForwardBatch,
        cache: PagedLatentCache,
        cache_layer: int,
        rows: list[int] | None = None,
    ) -> Tensor:
        started = time.perf_counter()
        self.latent_bytes_read += latent_bytes(batch, cache)
        out = super().forward(x, cos, sin, batch, cache, cache_layer, rows)
        self.seconds += time.perf_counter() - started
        return self.group.all_reduce(out)


def latent_bytes(batch: ForwardBatch, cache: PagedLatentCache) -> int:
    """Bytes of cached latents one layer's attention reads for ``batch``: every sequence's
    context, one latent row per token."""
    return sum(batch.context_lens) * cache.latent_dim * cache.kv.element_size()


class ParallelSwiGLU(SwiGLU):
    """A dense MLP over this rank's intermediate slice; down_proj's partial sums all-reduced."""

    def __init__(self, dim: int, hidden: int, dtype: torch.dtype, group: RankGroup) -> None:
        super().__init__(dim, hidden, dtype)
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        return self.group.all_reduce(super().forward(x))


class ParallelMoE(MoE):
    """The MoE layer on one rank: the router whole, the shared experts' intermediate slice, and
    either every routed expert's intermediate slice (tensor parallel) or this rank's experts
    whole (expert parallel, ``experts[j]`` is global expert ``layout.local_experts[j]``)."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, group: RankGroup, layout: Layout
    ) -> None:
        moe = config.moe
        sliced = dataclasses.replace(
            moe, moe_intermediate_size=moe.moe_intermediate_size // layout.world
        )
        super().__init__(dataclasses.replace(config, moe=sliced), dtype)
        self.group = group
        self.layout = layout
        self.expert_parallel = layout.expert_parallel
        if self.expert_parallel:
            self.first_expert = layout.local_experts(config).start
            self.experts = nn.ModuleList(
                SwiGLU(config.hidden_size, moe.moe_intermediate_size, dtype)
                for _ in layout.local_experts(config)
            )

    def forward(self, x: Tensor) -> Tensor:  # x: [T, D] (the same on every rank) -> [T, D]
        if not self.expert_parallel:
            return self.group.all_reduce(super().forward(x))
        weights, ids = self.gate(x)  # [T, k], identical on every rank
        out = self.shared_experts(x) if self.shared_experts is not None else torch.zeros_like(x)
        start, stop = _token_share(x.shape[0], self.layout)
        routed = self._dispatch_combine(x[start:stop], weights[start:stop], ids[start:stop])
        out[start:stop] += routed
        return self.group.all_reduce(out)

    def _dispatch_combine(self, x: Tensor, weights: Tensor, ids: Tensor) -> Tensor:
        """Routed output [n, D] of this rank's tokens x [n, D]: each (token, expert) pair goes
        to the expert's rank, comes back as the expert's output and is weighted and summed."""
        group, world, top_k = self.group, self.layout.world, ids.shape[1]
        per_rank = len(self.experts)
        flat = ids.flatten()
        order = flat.argsort(stable=True)  # pairs grouped by expert, so by destination rank
        experts_sent = flat[order]
        send_counts = torch.bincount(experts_sent // per_rank, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        ones = [1] * world
        group.all_to_all(recv_counts, send_counts, ones, ones)
        sends, recvs = send_counts.tolist(), recv_counts.tolist()
        tokens = order // top_k
        send_x = x.index_select(0, tokens)  # [P, D]
        recv_x = x.new_empty(sum(recvs), x.shape[1])
        group.all_to_all(recv_x, send_x, recvs, sends)
        recv_ids = experts_sent.new_empty(sum(recvs))
        group.all_to_all(recv_ids, experts_sent, recvs, sends)
        computed = self._run_local_experts(recv_x, recv_ids - self.first_expert)
        back = x.new_empty(send_x.shape)
        group.all_to_all(back, computed, sends, recvs)
        weighted = back * weights.flatten()[order, None].to(x.dtype)
        return torch.zeros_like(x).index_add_(0, tokens, weighted)

    def _run_local_experts(self, x: Tensor, local_ids: Tensor) -> Tensor:
        """x [R, D] rows each for local expert ``local_ids[i]`` -> the experts' outputs [R, D].

        With the local experts stacked (``pack_experts``, done at load where a kernel runs)
        they go through the fused path as one top-1 MoE of weight 1: the Triton kernel on GPU,
        the C kernel on CPU; otherwise (FP8-resident experts on CPU) one expert at a time."""
        if x.shape[0] == 0:
            return torch.empty_like(x)
        if self.stacked is not None:
            ids = local_ids[:, None]  # [R, 1]
            ones = torch.ones(ids.shape, dtype=torch.float32, device=x.device)
            if x.shape[0] <= ops.MAX_ROWS:
                packed = ops.moe(x, self.stacked.w13, self.stacked.w2, ids, ones, None)
                if packed is not None:
                    return packed
            if support.use_kernels(x):
                return fused_moe(x, self.stacked, ones, ids)
        out = torch.empty_like(x)
        order = local_ids.argsort(stable=True)
        counts = torch.bincount(local_ids, minlength=len(self.experts)).tolist()
        start = 0
        for expert_id, count in enumerate(counts):
            if not count:
                continue
            rows = order[start : start + count]
            out[rows] = self.experts[expert_id](x.index_select(0, rows))
            start += count
        return out


def _token_share(num_tokens: int, layout: Layout) -> tuple[int, int]:
    """This rank's tokens [start, stop) for expert dispatch (balanced; some may be empty)."""
    return (
        num_tokens * layout.rank // layout.world,
        num_tokens * (layout.rank + 1) // layout.world,
    )
