"""The model's ``config.json``, parsed once into a frozen, self-validating ``ModelConfig``.

Reads DeepSeek's own spelling (``rope_scaling``, ``torch_dtype``) and HF transformers 5's
(``rope_parameters``, ``dtype``). Derived values are properties; nothing is written back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.model.dtypes import DTYPE_NAMES, torch_dtype


class ConfigError(ValueError):
    """config.json is missing a field or describes a model this engine cannot run."""


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention."""

    num_heads: int
    q_lora_rank: int | None  # None: one q_proj instead of q_a_proj/q_a_layernorm/q_b_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    attention_bias: bool = False

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Cached values per token and layer: normalized c_kv then rotated k_pe."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoEConfig:
    """Routed experts with noaux_tc group-limited routing, plus shared experts."""

    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    first_k_dense_replace: int
    moe_layer_freq: int = 1

    @property
    def experts_per_group(self) -> int:
        return self.n_routed_experts // self.n_group


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding; ``factor`` > 1 with ``original_max_position_embeddings`` means YaRN."""

    theta: float
    rope_type: str = "default"  # "default" or "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0

    @property
    def is_yarn(self) -> bool:
        return self.rope_type == "yarn"


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN attention temperature: 0.1 * mscale * ln(factor) + 1 (1 when not stretched)."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class QuantConfig:
    """Block-scaled FP8 weights as DeepSeek ships them."""

    method: str  # "fp8"
    fmt: str  # "e4m3"
    weight_block_size: tuple[int, int]


@dataclass(frozen=True)
class ModelConfig:
    """Everything about the network that the weights do not say themselves."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int  # dense FFN layers
    num_hidden_layers: int
    num_nextn_predict_layers: int  # MTP layers, stored as model.layers.{num_hidden_layers + k}
    max_position_embeddings: int
    rms_norm_eps: float
    mla: MLAConfig
    moe: MoEConfig
    rope: RopeConfig
    tie_word_embeddings: bool = False
    torch_dtype: torch.dtype = torch.bfloat16  # storage dtype of non-quantized tensors
    quantization: QuantConfig | None = None
    bos_token_id: int | None = 0
    eos_token_id: int | None = 1

    def __post_init__(self) -> None:
        positive = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.mla.num_heads,
            "kv_lora_rank": self.mla.kv_lora_rank,
            "n_routed_experts": self.moe.n_routed_experts,
            "num_experts_per_tok": self.moe.num_experts_per_tok,
            "n_group": self.moe.n_group,
            "topk_group": self.moe.topk_group,
            "moe_layer_freq": self.moe.moe_layer_freq,
        }
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be positive, got {value}")
        if self.mla.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim must be even, got {self.mla.qk_rope_head_dim}")
        moe = self.moe
        if moe.n_routed_experts % moe.n_group:
            raise ConfigError(
                f"n_routed_experts {moe.n_routed_experts} not divisible by n_group {moe.n_group}"
            )
        if moe.topk_group > moe.n_group:
            raise ConfigError(f"topk_group {moe.topk_group} exceeds n_group {moe.n_group}")
        if moe.experts_per_group < 2 and moe.n_group > 1:
            raise ConfigError("group scores need at least 2 experts per group")
        if moe.num_experts_per_tok > moe.topk_group * moe.experts_per_group:
            raise ConfigError(
                f"num_experts_per_tok {moe.num_experts_per_tok} exceeds the "
                f"{moe.topk_group * moe.experts_per_group} experts in the kept groups"
            )
        if not 0 <= moe.first_k_dense_replace <= self.num_hidden_layers:
            raise ConfigError(f"first_k_dense_replace {moe.first_k_dense_replace} out of range")
        if self.tie_word_embeddings:
            raise ConfigError("tie_word_embeddings is not used by DeepSeek-V3 and not supported")
        if self.num_nextn_predict_layers < 0:
            raise ConfigError("num_nextn_predict_layers must be >= 0")
        if self.rope.is_yarn and (
            self.rope.original_max_position_embeddings is None or self.rope.factor <= 0
        ):
            raise ConfigError("yarn rope_scaling needs factor and original_max_position_embeddings")

    # Derived facts.

    @property
    def latent_dim(self) -> int:
        return self.mla.latent_dim

    @property
    def num_cache_layers(self) -> int:
        """Latent cache layers: one per decoder layer and one per MTP layer."""
        return self.num_hidden_layers + self.num_nextn_predict_layers

    def cache_bytes_per_token(self, dtype: torch.dtype, *, include_mtp: bool = False) -> int:
        layers = self.num_cache_layers if include_mtp else self.num_hidden_layers
        return layers * self.latent_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim^-0.5, times mscale^2 from mscale_all_dim when YaRN stretches positions."""
        scale = self.mla.qk_head_dim**-0.5
        if self.rope.is_yarn and self.rope.mscale_all_dim:
            mscale = yarn_mscale(self.rope.factor, self.rope.mscale_all_dim)
            scale *= mscale * mscale
        return scale

    def is_moe_layer(self, layer: int) -> bool:
        """Decoder layer ``layer`` (MTP layers count after the decoder) has a MoE FFN."""
        if layer >= self.num_hidden_layers:
            return True
        return layer >= self.moe.first_k_dense_replace and layer % self.moe.moe_layer_freq == 0

    @property
    def moe_layer_indices(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    # Parsing.

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"no config.json at {path}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        reader = _Reader(raw)
        model_type = raw.get("model_type", "deepseek_v3")
        if model_type != "deepseek_v3":
            raise ConfigError(f"model_type {model_type!r} is not deepseek_v3")
        topk_method = raw.get("topk_method", "noaux_tc")
        scoring = raw.get("scoring_func", "sigmoid")
        hidden_act = raw.get("hidden_act", "silu")
        if (topk_method, scoring, hidden_act) != ("noaux_tc", "sigmoid", "silu"):
            raise ConfigError(
                f"only topk_method noaux_tc, scoring_func sigmoid, hidden_act silu are supported; "
                f"got {topk_method}, {scoring}, {hidden_act}"
            )
        num_heads = reader.int("num_attention_heads")
        kv_heads = raw.get("num_key_value_heads") or num_heads
        if kv_heads != num_heads:
            raise ConfigError(f"MLA needs num_key_value_heads == num_attention_heads: {kv_heads}")
        mla = MLAConfig(
            num_heads=num_heads,
            q_lora_rank=raw.get("q_lora_rank"),
            kv_lora_rank=reader.int("kv_lora_rank"),
            qk_nope_head_dim=reader.int("qk_nope_head_dim"),
            qk_rope_head_dim=reader.int("qk_rope_head_dim"),
            v_head_dim=reader.int("v_head_dim"),
            attention_bias=bool(raw.get("attention_bias", False)),
        )
        moe = MoEConfig(
            n_routed_experts=reader.int("n_routed_experts"),
            n_shared_experts=int(raw.get("n_shared_experts") or 0),
            num_experts_per_tok=reader.int("num_experts_per_tok"),
            moe_intermediate_size=reader.int("moe_intermediate_size"),
            n_group=int(raw.get("n_group") or 1),
            topk_group=int(raw.get("topk_group") or 1),
            routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            first_k_dense_replace=int(raw.get("first_k_dense_replace") or 0),
            moe_layer_freq=int(raw.get("moe_layer_freq") or 1),
        )
        return cls(
            vocab_size=reader.int("vocab_size"),
            hidden_size=reader.int("hidden_size"),
            intermediate_size=reader.int("intermediate_size"),
            num_hidden_layers=reader.int("num_hidden_layers"),
            num_nextn_predict_layers=int(
                raw.get("num_nextn_predict_layers", raw.get("num_mtp_layers")) or 0
            ),
            max_position_embeddings=reader.int("max_position_embeddings"),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            mla=mla,
            moe=moe,
            rope=_parse_rope(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            torch_dtype=_parse_dtype(raw.get("torch_dtype", raw.get("dtype", "bfloat16"))),
            quantization=_parse_quant(raw.get("quantization_config")),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=_first_id(raw.get("eos_token_id")),
        )


class _Reader:
    """Required fields with a clear error when absent or of the wrong type."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def int(self, key: str) -> int:
        if key not in self.raw or self.raw[key] is None:
            raise ConfigError(f"config.json lacks {key}")
        value = self.raw[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config.json {key} must be an integer, got {value!r}")
        return value


def _parse_rope(raw: dict[str, Any]) -> RopeConfig:
    params = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    theta = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise ConfigError(f"rope type {rope_type!r} is not supported (default or yarn)")
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    return RopeConfig(
        theta=float(theta),
        rope_type="yarn",
        factor=float(params["factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=float(params.get("mscale") or 1.0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
    )


def _parse_dtype(name: Any) -> torch.dtype:
    try:
        return torch_dtype(str(name))
    except ValueError as exc:
        raise ConfigError(f"torch_dtype {name!r} is not one of {list(DTYPE_NAMES)}") from exc


def _parse_quant(raw: dict[str, Any] | None) -> QuantConfig | None:
    if not raw:
        return None
    method = raw.get("quant_method")
    fmt = raw.get("fmt", "e4m3")
    block = raw.get("weight_block_size") or [128, 128]
    if method != "fp8" or fmt != "e4m3" or len(block) != 2:
        raise ConfigError(f"quantization_config {raw} is not block-scaled fp8 e4m3")
    return QuantConfig(method=method, fmt=fmt, weight_block_size=(int(block[0]), int(block[1])))


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)
