"""Load an HF-style DeepSeek-V3 checkpoint directory into ``DeepseekV3ForCausalLM``.

Reads config.json, then either model.safetensors.index.json with its shards or one
model.safetensors. Everything is validated against the config before any data is read (names,
shapes, FP8 scale grids, files), then the module, built on the meta device and allocated empty,
is filled tensor by tensor, shard by shard: peak memory is about the model's size. FP8 e4m3
linears stay FP8 (``FP8Linear``, about one byte per weight) unless ``fp8_weights="dequantize"``,
which dequantizes them with their ``weight_scale_inv`` blocks as they are copied in.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from tqdm import tqdm

from backend.kernels import support
from backend.model import fp8
from backend.model.config import ConfigError, ModelConfig
from backend.model.dtypes import FP8_WEIGHT_MODES, FP8Weights
from backend.model.fp8_linear import make_resident
from backend.model.layers import SwiGLU
from backend.model.model import DeepseekV3ForCausalLM
from backend.model.moe import MoE
from backend.native.build import library

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SCALE_SUFFIX = ".weight_scale_inv"
_PROGRESS_MIN_BYTES = 1 << 30  # show a progress bar for loads above 1 GiB

_LOADABLE_DTYPES = frozenset({"F32", "F16", "BF16", "F8_E4M3"})  # safetensors dtype names


class CheckpointError(ValueError):
    """The checkpoint directory is unreadable or disagrees with its config."""


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling defaults from generation_config.json."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class TensorEntry:
    """Where one stored tensor lives and what it looks like (read from the header only)."""

    file: Path
    shape: tuple[int, ...]
    dtype: str


def load_generation_config(model_dir: str | Path) -> GenerationDefaults:
    path = Path(model_dir) / "generation_config.json"
    if not path.exists():
        return GenerationDefaults()
    raw = json.loads(path.read_text())
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    return GenerationDefaults(
        temperature=float(raw.get("temperature", 1.0)),
        top_p=float(raw.get("top_p", 1.0)),
        top_k=int(raw.get("top_k", 0) or 0),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def read_index(model_dir: Path) -> dict[str, TensorEntry]:
    """Every stored tensor's file, shape and dtype, checking the index against the shards."""
    index_path = model_dir / INDEX_FILE
    if index_path.exists():
        weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
    elif (model_dir / SINGLE_FILE).exists():
        weight_map = {}
    else:
        raise CheckpointError(f"{model_dir} has neither {INDEX_FILE} nor {SINGLE_FILE}")
    files = sorted(set(weight_map.values())) or [SINGLE_FILE]
    entries: dict[str, TensorEntry] = {}
    for filename in files:
        path = model_dir / filename
        if not path.exists():
            named = sorted(n for n, f in weight_map.items() if f == filename)
            raise CheckpointError(
                f"shard {filename} is missing (named in the index for {named[0]} "
                f"and {len(named) - 1} more tensors)"
            )
        for name, shape, dtype in _shard_header(path):
            entries[name] = TensorEntry(path, shape, dtype)
    for name, filename in weight_map.items():
        if name not in entries or entries[name].file.name != filename:
            raise CheckpointError(f"index names tensor {name} in {filename}, which lacks it")
    return entries


def _shard_header(path: Path) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of each tensor in a shard; a truncated file raises CheckpointError."""
    try:
        with path.open("rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(header_len))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"shard {path.name} has an unreadable header: {exc}") from exc
    size = path.stat().st_size
    for name, info in header.items():
        if name == "__metadata__":
            continue
        end = 8 + header_len + int(info["data_offsets"][1])
        if end > size:
            raise CheckpointError(
                f"shard {path.name} is truncated: tensor {name} {tuple(info['shape'])} "
                f"ends at byte {end}, the file has {size}"
            )
        yield name, tuple(int(d) for d in info["shape"]), str(info["dtype"])


def _mtp_aliases(config: ModelConfig) -> set[str]:
    """Copies some checkpoints keep inside the MTP layer of tensors the model shares."""
    return {
        f"model.layers.{config.num_hidden_layers + k}.embed_tokens.weight"
        for k in range(config.num_nextn_predict_layers)
    }


def _describe_mismatch(
    name: str, expected: tuple[int, ...], found: tuple[int, ...], config: ModelConfig
) -> str:
    hint = ""
    if name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias"):
        hint = f" (config n_routed_experts={config.moe.n_routed_experts}, weights have {found[0]})"
    elif "kv_a_proj_with_mqa" in name or "kv_b_proj" in name or "kv_a_layernorm" in name:
        hint = f" (config kv_lora_rank={config.mla.kv_lora_rank})"
    return f"tensor {name}: expected shape {expected} from config.json, found {found}{hint}"


def validate(
    config: ModelConfig, entries: dict[str, TensorEntry], expected: dict[str, tuple[int, ...]]
) -> None:
    """Raise CheckpointError at the first disagreement between config-derived shapes and weights."""
    for name, shape in expected.items():
        entry = entries.get(name)
        if entry is None:
            raise CheckpointError(f"missing tensor {name} (expected shape {shape})")
        if entry.dtype not in _LOADABLE_DTYPES:
            raise CheckpointError(f"tensor {name} has unsupported dtype {entry.dtype}")
        if entry.shape != shape:
            raise CheckpointError(_describe_mismatch(name, shape, entry.shape, config))
        if entry.dtype == "F8_E4M3":
            _check_scale(config, name, shape, entries)
    skip_prefixes = _skipped_mtp_prefixes(config, expected)
    allowed = _mtp_aliases(config)
    alias_shape = (config.vocab_size, config.hidden_size)
    for name, entry in entries.items():
        if name in allowed and entry.shape != alias_shape:
            raise CheckpointError(_describe_mismatch(name, alias_shape, entry.shape, config))
        if name in expected or name in allowed or name.startswith(skip_prefixes):
            continue
        if name.endswith(SCALE_SUFFIX) and name.removesuffix("_scale_inv") in expected:
            continue
        raise CheckpointError(f"unexpected tensor {name} with shape {entry.shape}")


def _skipped_mtp_prefixes(config: ModelConfig, expected: dict[str, Any]) -> tuple[str, ...]:
    """MTP layers present in the config but not being loaded (load_mtp=False)."""
    return tuple(
        f"model.layers.{config.num_hidden_layers + k}."
        for k in range(config.num_nextn_predict_layers)
        if f"model.layers.{config.num_hidden_layers + k}.enorm.weight" not in expected
    )


def _check_scale(
    config: ModelConfig, name: str, shape: tuple[int, ...], entries: dict[str, TensorEntry]
) -> None:
    scale_name = name.removesuffix(".weight") + SCALE_SUFFIX
    block = config.quantization.weight_block_size if config.quantization else fp8.DEFAULT_BLOCK
    want = fp8.scale_shape((shape[0], shape[1]), block)
    scale = entries.get(scale_name)
    if scale is None:
        raise CheckpointError(f"FP8 tensor {name} has no {scale_name} (expected shape {want})")
    if scale.shape != want:
        raise CheckpointError(f"tensor {scale_name}: expected shape {want}, found {scale.shape}")


def _read_scale(shard: Any, entries: dict[str, TensorEntry], name: str) -> torch.Tensor:
    """The weight_scale_inv of FP8 weight ``name``, from the open shard or the one holding it."""
    scale_name = name.removesuffix(".weight") + SCALE_SUFFIX
    if scale_name in shard.keys():  # noqa: SIM118 (safe_open is not a dict)
        return shard.get_tensor(scale_name)
    with safe_open(entries[scale_name].file, framework="pt", device="cpu") as other:
        return other.get_tensor(scale_name)


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    load_mtp: bool = True,
    progress: bool | None = None,
    fp8_weights: FP8Weights = "resident",
    report: Callable[[int, int], None] | None = None,
) -> DeepseekV3ForCausalLM:
    """Validate and load a checkpoint; ``progress`` None shows a bar for loads above 1 GiB where
    stderr is a terminal (never in a log stream). ``report(done, total)`` hears of each tensor
    loaded.

    ``fp8_weights``: "resident" keeps the checkpoint's e4m3 linears in FP8 (the block-scaled
    GEMM on CUDA, tile-by-tile dequantization on CPU); "dequantize" converts them to ``dtype``.
    """
    if fp8_weights not in FP8_WEIGHT_MODES:
        raise ValueError(f"fp8_weights must be one of {FP8_WEIGHT_MODES}, got {fp8_weights!r}")
    model_dir = Path(model_dir)
    try:
        config = ModelConfig.from_file(model_dir)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    entries = read_index(model_dir)
    include_mtp = load_mtp and config.num_nextn_predict_layers > 0
    block = config.quantization.weight_block_size if config.quantization else fp8.DEFAULT_BLOCK
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(config, dtype=dtype, include_mtp=include_mtp)
        if fp8_weights == "resident":
            stored_fp8 = {name for name, entry in entries.items() if entry.dtype == "F8_E4M3"}
            make_resident(model, stored_fp8, block)
    targets = model.state_dict(keep_vars=True)
    validate(config, entries, {n: tuple(t.shape) for n, t in targets.items()})
    model.to_empty(device=device)
    targets = model.state_dict(keep_vars=True)
    by_file: dict[Path, list[str]] = {}
    for name in targets:
        by_file.setdefault(entries[name].file, []).append(name)
    total_bytes = sum(t.numel() * t.element_size() for t in targets.values())
    if progress is None:
        show = total_bytes >= _PROGRESS_MIN_BYTES and sys.stderr.isatty()
    else:
        show = progress
    total, done = len(targets), 0
    with (
        tqdm(total=len(targets), desc="loading weights", unit="tensor", disable=not show) as bar,
        torch.no_grad(),
    ):
        for path, names in by_file.items():
            with safe_open(path, framework="pt", device="cpu") as shard:
                for name in names:
                    tensor = shard.get_tensor(name)
                    if tensor.dtype == fp8.FP8_DTYPE and targets[name].dtype != fp8.FP8_DTYPE:
                        scale = _read_scale(shard, entries, name)
                        tensor = fp8.dequantize(tensor, scale, block, dtype=torch.float32)
                    targets[name].data.copy_(tensor)
                    bar.update(1)
                    done += 1
                    if report is not None:
                        report(done, total)
    prepare_for_kernels(model)
    mla = config.mla
    facts = {
        "attention": "MLA",
        "kv_lora_rank": mla.kv_lora_rank,
        "rope_dim": mla.qk_rope_head_dim,
        "cache_bytes_per_token": config.cache_bytes_per_token(dtype),
        "layers": config.num_hidden_layers,
        "mtp_layers": model.num_mtp_layers,
        "experts": config.moe.n_routed_experts,
        "top_k": config.moe.num_experts_per_tok,
        "weights": _stored_weights(config, model),
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
    }
    summary = " ".join(f"{name}={value}" for name, value in facts.items())
    logger.info("loaded %s: %s", model_dir, summary, extra={"checkpoint": str(model_dir), **facts})
    return model.eval()


def _stored_weights(config: ModelConfig, model: DeepseekV3ForCausalLM) -> str:
    if config.quantization is None:
        return str(config.torch_dtype).removeprefix("torch.")
    resident = any(p.dtype == fp8.FP8_DTYPE for p in model.parameters())
    return "fp8 (resident)" if resident else "fp8 (dequantized at load)"


def prepare_for_kernels(model: DeepseekV3ForCausalLM) -> None:
    """Where the Triton kernels will run (CUDA with triton), or the C kernels (CPU, fp32 or bf16
    experts, a compiler present), stack each MoE layer's experts for the fused kernel; the
    experts' own parameters become views, so memory does not grow."""
    weight = model.lm_head.weight
    triton = support.use_kernels(weight)
    native = weight.is_cpu and weight.dtype in (torch.float32, torch.bfloat16)
    if not (triton or (native and library() is not None)):
        return
    for module in model.modules():
        if isinstance(module, MoE) and (triton or _plain_experts(module)):
            module.pack_experts()


def _plain_experts(module: MoE) -> bool:
    """The routed experts are fp32/bf16 linears (FP8-resident ones stay unstacked on CPU)."""
    weight = cast(SwiGLU, module.experts[0]).gate_proj.weight
    return weight.dtype in (torch.float32, torch.bfloat16)
