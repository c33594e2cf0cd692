"""What a model needs in memory: weights by precision, latent cache per token, activations.

Weights are counted from the config (one layer of each kind is built on the meta device and
its tensors counted, then multiplied), so no checkpoint needs to be present. FP8 linears (the
ones DeepSeek ships in e4m3, ``fp8.is_fp8_linear``) take one byte per weight plus one fp32
scale per 128x128 block when resident, or the compute dtype's width when dequantized at load.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from backend.model import fp8
from backend.model.config import ModelConfig
from backend.model.model import DecoderLayer, MTPLayer

_FP32_NAMES = ("e_score_correction_bias",)  # stored and used in fp32 whatever the dtype


@dataclass(frozen=True)
class WeightBytes:
    """Parameters and bytes of the weights, by storage precision."""

    params: dict[str, int]  # precision -> parameters
    bytes: dict[str, int]  # precision -> bytes (FP8 includes its scale grids)

    @property
    def total_params(self) -> int:
        return sum(self.params.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def _layer_counts(config: ModelConfig, include_mtp: bool) -> list[tuple[nn.Module, int]]:
    """(one layer of each kind built on meta, how many layers are like it)."""
    dense = [i for i in range(config.num_hidden_layers) if not config.is_moe_layer(i)]
    moe = [i for i in range(config.num_hidden_layers) if config.is_moe_layer(i)]
    kinds: list[tuple[nn.Module, int]] = []
    with torch.device("meta"):
        for layers in (dense, moe):
            if layers:
                kinds.append((DecoderLayer(config, layers[0], torch.bfloat16), len(layers)))
        mtp = config.num_nextn_predict_layers if include_mtp else 0
        if mtp:
            kinds.append((MTPLayer(config, config.num_hidden_layers, torch.bfloat16), mtp))
    return kinds


def weight_bytes(
    config: ModelConfig, *, fp8_resident: bool, dtype: torch.dtype, include_mtp: bool = True
) -> WeightBytes:
    """Weights of ``config``: FP8 linears at one byte (``fp8_resident`` and the config is FP8)
    or at ``dtype``; other tensors at ``dtype`` (router biases at fp32)."""
    width = torch.empty((), dtype=dtype).element_size()
    dtype_name = str(dtype).removeprefix("torch.")
    quantized = fp8_resident and config.quantization is not None
    block = config.quantization.weight_block_size if config.quantization else fp8.DEFAULT_BLOCK
    params: Counter[str] = Counter()
    sizes: Counter[str] = Counter()

    def add(name: str, shape: tuple[int, ...], copies: int) -> None:
        numel = copies * int(torch.Size(shape).numel())
        if quantized and fp8.is_fp8_linear(name):
            rows, cols = fp8.scale_shape((shape[0], shape[1]), block)
            params["fp8"] += numel
            sizes["fp8"] += numel + copies * rows * cols * 4
        elif name.endswith(_FP32_NAMES):
            params["float32"] += numel
            sizes["float32"] += 4 * numel
        else:
            params[dtype_name] += numel
            sizes[dtype_name] += width * numel

    vocab_rows = (config.vocab_size, config.hidden_size)
    add("model.embed_tokens.weight", vocab_rows, 1)
    add("lm_head.weight", vocab_rows, 1)
    add("model.norm.weight", (config.hidden_size,), 1)
    for layer, copies in _layer_counts(config, include_mtp):
        for name, tensor in layer.state_dict().items():
            add(f"model.layers.0.{name}", tuple(tensor.shape), copies)
    return WeightBytes(dict(params), dict(sizes))


def activation_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Peak live activations of one layer per token of the step, an estimate: the residual
    stream and normed input, the query, the expanded K/V rows of a prefill chunk (and the SDPA
    rows built from them), the attention output, the routed experts' gate/up/hidden rows and
    their fp32 outputs, per token."""
    width = torch.empty((), dtype=dtype).element_size()
    mla, moe = config.mla, config.moe
    heads = mla.num_heads
    per_token = 3 * config.hidden_size * width
    per_token += heads * mla.qk_head_dim * width  # query
    per_token += heads * (mla.qk_nope_head_dim + mla.v_head_dim) * width  # kv_b_proj output
    per_token += heads * (mla.qk_head_dim + mla.v_head_dim) * width  # SDPA key|value rows
    per_token += heads * mla.v_head_dim * width  # attention output
    inter = max(moe.moe_intermediate_size * moe.num_experts_per_tok, config.intermediate_size)
    per_token += 3 * inter * width  # gate, up, silu(gate) * up
    per_token += moe.num_experts_per_tok * config.hidden_size * 4  # routed outputs, fp32
    return per_token
