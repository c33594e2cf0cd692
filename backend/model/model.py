"""DeepSeek-V3 / V3.1 causal LM over a paged MLA latent cache, with its MTP draft layer.

Module and parameter names follow the HF checkpoint exactly (``model.layers.N.self_attn...``),
the MTP layer included (``model.layers.{num_hidden_layers}``), so the loader maps names 1:1.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.config import ModelConfig
from backend.model.layers import Linear, RMSNorm, SwiGLU
from backend.model.mla import MAX_SHORT_QUERY, MLA
from backend.model.moe import MoE
from backend.model.rope import Rotary


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then h + ffn(norm(h)); the FFN is dense or MoE."""

    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = MLA(config, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp: MoE | SwiGLU = (
            MoE(config, dtype)
            if config.is_moe_layer(layer)
            else SwiGLU(config.hidden_size, config.intermediate_size, dtype)
        )

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
        """x [T, D] -> [T, D], or [R, D] for ``rows`` only (every row's latent still cached)."""
        normed = self.input_layernorm(x)
        if rows is None:
            attended = self.self_attn(normed, cos, sin, batch, cache, cache_layer)
        else:
            attended = self.self_attn(normed, cos, sin, batch, cache, cache_layer, rows)
            if not rows:  # the latents are cached; nothing else is read
                return attended
            x = x[rows]
        normed, h = self.post_attention_layernorm.add_forward(attended, x)
        return h + self.mlp(normed)


class SharedHead(nn.Module):
    """The MTP layer's own output norm and vocabulary projection."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.head = Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)


class MTPLayer(DecoderLayer):
    """Multi-token prediction: one more block fed eh_proj([enorm(embed(t+1)) | hnorm(h_t)])."""

    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype) -> None:
        super().__init__(config, layer, dtype)
        dim = config.hidden_size
        self.enorm = RMSNorm(dim, config.rms_norm_eps, dtype)
        self.hnorm = RMSNorm(dim, config.rms_norm_eps, dtype)
        self.eh_proj = Linear(2 * dim, dim, bias=False, dtype=dtype)
        self.shared_head = SharedHead(config, dtype)


class DeepseekV3Model(nn.Module):
    """``model.*``: embedding, decoder layers then MTP layers, final norm."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, num_mtp_layers: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        layers = [DecoderLayer(config, i, dtype) for i in range(config.num_hidden_layers)]
        layers.extend(
            MTPLayer(config, config.num_hidden_layers + k, dtype) for k in range(num_mtp_layers)
        )
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)


class DeepseekV3ForCausalLM(nn.Module):
    """The whole network. ``forward`` runs one step over a flattened batch and the paged cache.

    Cache layer i belongs to decoder layer i; cache layer num_hidden_layers + k to MTP layer k.
    """

    # Ranks that each attend to a share of the sequences from a latent pool of their own, rank
    # r's block ids from r x attention_pool_stride (data-parallel attention); 1: one pool.
    attention_ranks = 1
    attention_pool_stride = 0

    def __init__(
        self, config: ModelConfig, *, dtype: torch.dtype = torch.float32, include_mtp: bool = True
    ) -> None:
        super().__init__()
        self.config = config
        self.num_mtp_layers = config.num_nextn_predict_layers if include_mtp else 0
        self.model = DeepseekV3Model(config, dtype, self.num_mtp_layers)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)
        self.rotary = Rotary(config.rope, config.mla.qk_rope_head_dim)

    @property
    def num_cache_layers(self) -> int:
        return self.config.num_hidden_layers + self.num_mtp_layers

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def _cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.rotary.cos_sin(positions)

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, cache: PagedLatentCache, rows: Tensor | None = None
    ) -> Tensor:
        """Final (normed) hidden states [T, D] of the batch's new tokens; with ``rows`` [R]
        (long, increasing) those rows' only, [R, D]: in a step with a prefill chunk the last
        layer then attends and runs its MLP for those rows alone (every layer still caches
        every row's latent)."""
        x = self.model.embed_tokens(batch.input_ids)
        cos, sin = self._cos_sin(batch.positions)
        last = self.config.num_hidden_layers - 1
        wanted = _pruned_rows(batch, rows)
        for index in range(last):
            x = self.model.layers[index](x, cos, sin, batch, cache, index)
        x = self.model.layers[last](x, cos, sin, batch, cache, last, wanted)
        if rows is not None and wanted is None:
            x = x.index_select(0, rows)
        return self.model.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """[N, D] -> [N, vocab] fp32."""
        return self.lm_head(hidden).float()

    @torch.inference_mode()
    def forward_with_logits(
        self, batch: ForwardBatch, cache: PagedLatentCache, rows: Tensor, *, prune: bool = False
    ) -> tuple[Tensor, Tensor]:
        """A step: the forward's hidden states [T, D] and the logits [R, vocab] fp32 of its
        rows ``rows`` [R] (long). With ``prune`` (the caller reads no other row's hidden state)
        the hidden states are the rows' only, [R, D], and a prefill step's last layer computes
        only them. The parallel model sends its workers this as one command."""
        if prune:
            hidden = self.forward(batch, cache, rows)
            return hidden, self.compute_logits(hidden)
        hidden = self.forward(batch, cache)
        return hidden, self.compute_logits(hidden.index_select(0, rows))

    @torch.inference_mode()
    def mtp_forward(
        self,
        batch: ForwardBatch,
        cache: PagedLatentCache,
        previous_hidden: Tensor,
        depth: int = 0,
        rows: Tensor | None = None,
    ) -> Tensor:
        """Draft hidden [T, D] (normed by shared_head.norm) from MTP layer ``depth``; with
        ``rows`` [R] (long, increasing) those rows' only, [R, D], computed for them alone in a
        step with a prefill chunk (the layer still caches every row's latent).

        ``batch.input_ids[i]`` is token t+1 for the main model's position t = ``positions[i]``
        and ``previous_hidden[i]`` is the main model's final hidden state at t.
        """
        if depth >= self.num_mtp_layers:
            raise ValueError(f"model has {self.num_mtp_layers} MTP layers, asked for {depth}")
        layer_index = self.config.num_hidden_layers + depth
        layer = self.model.layers[layer_index]
        assert isinstance(layer, MTPLayer)
        embedded = layer.enorm(self.model.embed_tokens(batch.input_ids))
        x = layer.eh_proj(torch.cat((embedded, layer.hnorm(previous_hidden)), dim=-1))
        cos, sin = self._cos_sin(batch.positions)
        wanted = _pruned_rows(batch, rows)
        x = layer(x, cos, sin, batch, cache, layer_index, wanted)
        if rows is not None and wanted is None:
            x = x.index_select(0, rows)
        return layer.shared_head.norm(x)

    @torch.inference_mode()
    def compute_draft_logits(self, hidden: Tensor, depth: int = 0) -> Tensor:
        """MTP hidden [N, D] -> [N, vocab] fp32 through the MTP layer's shared_head.head."""
        layer = self.model.layers[self.config.num_hidden_layers + depth]
        assert isinstance(layer, MTPLayer)
        return layer.shared_head.head(hidden).float()

    def close(self) -> None:
        """Release what the model holds beyond this process: nothing on one device (the
        parallel engine's rank 0 stops its worker ranks)."""


def _pruned_rows(batch: ForwardBatch, rows: Tensor | None) -> list[int] | None:
    """``rows`` as a list where computing the last layer for them alone pays: in a step with
    a prefill chunk (a decode step's rows are nearly all wanted, and its attention runs as a
    batch already); None to compute every row."""
    if rows is None or max(batch.seq_lens_q) <= MAX_SHORT_QUERY:
        return None
    wanted = rows.tolist()
    if any(b <= a for a, b in zip(wanted, wanted[1:], strict=False)):
        return None
    return wanted
