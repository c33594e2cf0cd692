"""Write a DeepSeek-V3 architecture checkpoint with random weights, in DeepSeek's own layout.

``python -m backend.demo_checkpoint OUT_DIR [--preset tiny|small] [--fp8] [--seed N] [--train]
[--train-steps N] [--train-fim-rate F]``

The directory holds config.json (DeepSeek's spelling: ``rope_scaling``, ``torch_dtype``),
generation_config.json, two or more safetensors shards with ``model.safetensors.index.json``, the
MTP layer as ``model.layers.{num_hidden_layers}``, the V3.1 tokenizer files, and with ``--fp8``
e4m3 weights with 128x128 ``weight_scale_inv`` blocks and a ``quantization_config``. YaRN's ramp
is active (small original context) and routing is group-limited (n_group > 1, topk_group smaller).
With ``--train`` the random weights are the starting point of a short training run of the model
and its MTP layer on the Python standard library's source (``backend.demo_train``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from backend.demo_train import StepReport, TrainOptions, train_weights
from backend.model import fp8
from backend.model.config import ModelConfig
from backend.model.dtypes import dtype_name
from backend.model.model import DeepseekV3ForCausalLM
from backend.text.tokenizer import Tokenizer
from backend.text.tokenizer_assets import write_tokenizer_files

VOCAB_SIZE = 129280

_COMMON: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "n_shared_experts": 1,
    "moe_layer_freq": 1,
    "num_nextn_predict_layers": 1,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "use_cache": True,
}

PRESETS: dict[str, dict[str, Any]] = {
    # Loads in well under a second; every path of the real model is exercised.
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 160,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "n_group": 4,
        "topk_group": 2,
        "max_position_embeddings": 2048,
        "rope_scaling": {
            "type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    },
    # About 190M parameters (three vocab matrices are most of it): big enough for benchmarks.
    "small": {
        "hidden_size": 384,
        "intermediate_size": 1024,
        "moe_intermediate_size": 256,
        "num_hidden_layers": 4,
        "first_k_dense_replace": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "q_lora_rank": 192,
        "kv_lora_rank": 128,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "n_routed_experts": 32,
        "num_experts_per_tok": 4,
        "n_group": 4,
        "topk_group": 2,
        "max_position_embeddings": 16384,
        "rope_scaling": {
            "type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 2048,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    },
}

GENERATION_CONFIG = {
    "_from_model_config": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.95,
}

FP8_QUANTIZATION = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
}


def demo_config(preset: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json contents for ``preset``, with top-level ``overrides`` applied."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    return {**_COMMON, **PRESETS[preset], **(overrides or {})}


def random_weights(config: ModelConfig, seed: int) -> dict[str, Tensor]:
    """fp32 tensors for every name the model expects (MTP included), scaled for unit activations.

    Router biases are positive, so biased scores stay positive (HF's 0.0 group mask then agrees
    with the -inf mask).
    """
    with torch.device("meta"):
        skeleton = DeepseekV3ForCausalLM(config, include_mtp=True)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, Tensor] = {}
    for name, meta in skeleton.state_dict().items():
        shape = tuple(meta.shape)
        if name.endswith("e_score_correction_bias"):
            tensor = torch.rand(shape, generator=generator) * 0.5
        elif name.endswith("norm.weight"):
            tensor = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        elif name.endswith("embed_tokens.weight"):
            tensor = torch.randn(shape, generator=generator)
        else:
            tensor = torch.randn(shape, generator=generator) / math.sqrt(shape[-1])
        tensors[name] = tensor
    return tensors


def _to_storage(tensors: dict[str, Tensor], dtype: torch.dtype, use_fp8: bool) -> dict[str, Tensor]:
    """Cast for storage; router bias stays fp32; FP8 adds ``weight_scale_inv`` per weight."""
    stored: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith("e_score_correction_bias"):
            stored[name] = tensor.float()
        elif use_fp8 and fp8.is_fp8_linear(name):
            weight, scale_inv = fp8.quantize(tensor.to(dtype))
            stored[name] = weight
            stored[name.removesuffix("weight") + "weight_scale_inv"] = scale_inv
        else:
            stored[name] = tensor.to(dtype).contiguous()
    return stored


def _write_shards(out_dir: Path, tensors: dict[str, Tensor], num_shards: int) -> None:
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    per_shard = total / num_shards
    names = list(tensors)
    groups: list[list[str]] = [[]]
    filled = 0
    for name in names:
        size = tensors[name].numel() * tensors[name].element_size()
        if groups[-1] and filled + size > per_shard * len(groups) and len(groups) < num_shards:
            groups.append([])
        groups[-1].append(name)
        filled += size
    weight_map: dict[str, str] = {}
    for index, group in enumerate(groups, start=1):
        filename = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in group}, out_dir / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, filename))
    index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2))


def write_demo_checkpoint(
    out_dir: str | Path,
    preset: str = "tiny",
    *,
    use_fp8: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    overrides: dict[str, Any] | None = None,
    num_shards: int = 2,
    tokenizer: bool = True,
    train: TrainOptions | None = None,
    report: StepReport | None = None,
) -> Path:
    """Write the checkpoint directory and return its path. Same seed -> same source weights;
    `train` trains them first (it needs the tokenizer files), telling `report` of each step."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = demo_config(preset, overrides)
    raw["torch_dtype"] = dtype_name(dtype)
    if use_fp8:
        raw["quantization_config"] = FP8_QUANTIZATION
    config = ModelConfig.from_dict(raw)
    if tokenizer or train is not None:
        write_tokenizer_files(out)
    weights = random_weights(config, seed)
    if train is not None:
        weights = train_weights(config, weights, Tokenizer.from_dir(out), train, report)
    tensors = _to_storage(weights, dtype, use_fp8)
    _write_shards(out, tensors, max(num_shards, 2))
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--fp8", action="store_true", help="store linear weights as FP8 e4m3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--train", action="store_true", help="train on the Python stdlib's source (minutes)"
    )
    parser.add_argument("--train-steps", type=int, default=TrainOptions.steps)
    parser.add_argument("--train-batch", type=int, default=TrainOptions.batch_size)
    parser.add_argument("--train-seq-len", type=int, default=TrainOptions.seq_len)
    parser.add_argument(
        "--train-fim-rate",
        type=float,
        default=TrainOptions.fim_rate,
        help="share of training windows in the fill-in-the-middle layout",
    )
    args = parser.parse_args(argv)
    train = (
        TrainOptions(
            steps=args.train_steps,
            batch_size=args.train_batch,
            seq_len=args.train_seq_len,
            fim_rate=args.train_fim_rate,
            seed=args.seed,
        )
        if args.train
        else None
    )
    path = write_demo_checkpoint(
        args.out_dir, args.preset, use_fp8=args.fp8, seed=args.seed, train=train
    )
    print(f"wrote {'trained ' if train else ''}{args.preset} checkpoint to {path}")


if __name__ == "__main__":
    main()
