"""Which slice of each checkpoint tensor a rank holds.

Tensor parallel (``world`` ranks): MLA heads are split (``q_proj``/``q_b_proj`` and ``kv_b_proj``
by output rows, ``o_proj`` by input columns); the latent projections (``q_a_proj``,
``kv_a_proj_with_mqa``) and so the latent cache stay whole on every rank, which each needs for
its own heads. Dense MLPs and the shared experts split their intermediate width (gate/up by
rows, down by columns). The embedding and the output head split the vocabulary by rows. With
``expert_parallel`` rank r holds routed experts [r E/N, (r + 1) E/N) whole; without it every
rank holds every expert's intermediate slice. The MTP layer's own head (used only by rank 0's
drafter) is whole on rank 0 and empty elsewhere. Everything else (norms, the router) is whole.

With ``data_parallel_attention`` every rank holds the attention whole (every head, its bias
once per rank): each runs it over its own sequences only (``backend.parallel.dp_attention``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backend.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class Slice:
    """Rows or columns [start, stop) of checkpoint tensor ``source`` along ``dim`` (None:
    whole); ``zero``: the rank holds zeros (a row-parallel bias counted once, on rank 0)."""

    source: str
    dim: int | None = None
    start: int = 0
    stop: int = 0
    zero: bool = False


@dataclass(frozen=True, slots=True)
class Layout:
    """Rank ``rank`` of ``world``; ``expert_parallel`` partitions the routed experts;
    ``data_parallel_attention`` keeps the attention whole on every rank."""

    rank: int
    world: int
    expert_parallel: bool = False
    data_parallel_attention: bool = False

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} of world {self.world}")

    def even(self, total: int) -> tuple[int, int]:
        """This rank's [start, stop) of ``total`` split evenly (``total`` divisible)."""
        share = total // self.world
        return self.rank * share, (self.rank + 1) * share

    def vocab_share(self, vocab: int) -> int:
        """Rows of the vocabulary each rank holds (the last may hold fewer)."""
        return -(-vocab // self.world)

    def vocab_range(self, vocab: int) -> tuple[int, int]:
        share = self.vocab_share(vocab)
        return min(vocab, self.rank * share), min(vocab, (self.rank + 1) * share)

    def check(self, config: ModelConfig) -> None:
        """Raise ValueError when ``config``'s widths do not split over ``world`` ranks."""
        moe = config.moe
        widths = {
            "num_attention_heads": 0 if self.data_parallel_attention else config.mla.num_heads,
            "intermediate_size": config.intermediate_size,
            "moe_intermediate_size": moe.moe_intermediate_size,
        }
        if self.expert_parallel:
            widths["n_routed_experts"] = moe.n_routed_experts
        for name, value in widths.items():
            if value % self.world:
                raise ValueError(
                    f"{name} {value} does not split over tensor_parallel {self.world} ranks"
                )

    def local_experts(self, config: ModelConfig) -> range:
        """Global ids of the routed experts this rank computes (all of them without EP)."""
        experts = config.moe.n_routed_experts
        if not self.expert_parallel:
            return range(experts)
        start, stop = self.even(experts)
        return range(start, stop)


_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


def slice_for(name: str, config: ModelConfig, layout: Layout) -> Slice:
    """The slice of the checkpoint behind local parameter or buffer ``name``."""
    vocab = config.vocab_size
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        start, stop = layout.vocab_range(vocab)
        return Slice(name, 0, start, stop)
    match = _LAYER.fullmatch(name)
    if match is None:
        return Slice(name)
    layer, rest = int(match.group(1)), match.group(2)
    mla, moe = config.mla, config.moe
    if rest == "shared_head.head.weight":
        return Slice(name) if layout.rank == 0 else Slice(name, 0, 0, 0)
    if rest.startswith("self_attn.") and layout.data_parallel_attention:
        return Slice(name)
    heads = layout.even(mla.num_heads)
    if rest in ("self_attn.q_proj.weight", "self_attn.q_b_proj.weight"):
        return _rows(name, heads, mla.qk_head_dim, 0)
    if rest == "self_attn.kv_b_proj.weight":
        return _rows(name, heads, mla.qk_nope_head_dim + mla.v_head_dim, 0)
    if rest == "self_attn.o_proj.weight":
        return _rows(name, heads, mla.v_head_dim, 1)
    if rest == "self_attn.o_proj.bias":
        return Slice(name, zero=layout.rank != 0)
    projection = rest.rsplit(".", 2)[-2] if rest.endswith(".weight") else ""
    dim = 1 if projection == "down_proj" else 0
    if rest.startswith("mlp.shared_experts."):
        width = moe.moe_intermediate_size * moe.n_shared_experts
        return _rows(name, layout.even(width), 1, dim)
    expert = _EXPERT.fullmatch(rest)
    if expert is not None:
        if layout.expert_parallel:
            global_id = layout.local_experts(config)[int(expert.group(1))]
            return Slice(f"model.layers.{layer}.mlp.experts.{global_id}.{expert.group(2)}.weight")
        return _rows(name, layout.even(moe.moe_intermediate_size), 1, dim)
    if rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"):
        return _rows(name, layout.even(config.intermediate_size), 1, dim)
    return Slice(name)


def _rows(name: str, span: tuple[int, int], width: int, dim: int) -> Slice:
    return Slice(name, dim, span[0] * width, span[1] * width)
