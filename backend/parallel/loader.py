"""Load one rank's shard of an HF-style DeepSeek-V3 checkpoint: sliced reads only.

The checkpoint is validated as for one device (names, shapes, FP8 scale grids), then the
rank's module is built on the meta device, allocated empty and filled through
``safe_open(...).get_slice(name)[...]``: each rank reads only its rows or columns of each tensor,
never a whole sharded tensor. FP8 weights stay FP8 where the rank's slice starts and ends on a
128-block boundary (their ``weight_scale_inv`` grid sliced alongside); a slice that cuts through
a block is dequantized at load from the scale rows covering it. ``LoadReport`` holds the bytes
the rank holds and its peak memory while loading.
"""

from __future__ import annotations

import logging
import resource
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from backend.model import fp8
from backend.model.checkpoint import (
    SCALE_SUFFIX,
    CheckpointError,
    TensorEntry,
    prepare_for_kernels,
    read_index,
    validate,
)
from backend.model.config import ConfigError, ModelConfig
from backend.model.dtypes import FP8Weights
from backend.model.fp8_linear import make_resident
from backend.model.model import DeepseekV3ForCausalLM
from backend.parallel.group import RankGroup
from backend.parallel.layout import Layout, Slice, slice_for
from backend.parallel.model import ShardedCausalLM, num_parameters_bytes

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One rank's load: bytes of its weights, and its process's peak memory (CPU: resident
    set; CUDA: the allocator's peak) in bytes."""

    rank: int
    weight_bytes: int
    peak_bytes: int


def load_shard(
    model_dir: str | Path,
    group: RankGroup,
    layout: Layout,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    fp8_weights: FP8Weights = "resident",
    load_mtp: bool = True,
) -> tuple[ShardedCausalLM, LoadReport]:
    """This rank's model, loaded and ready for the engine, and its load report."""
    model_dir = Path(model_dir)
    try:
        config = ModelConfig.from_file(model_dir)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    entries = read_index(model_dir)
    include_mtp = load_mtp and config.num_nextn_predict_layers > 0
    with torch.device("meta"):
        whole = DeepseekV3ForCausalLM(config, dtype=dtype, include_mtp=include_mtp)
        validate(config, entries, {n: tuple(t.shape) for n, t in whole.state_dict().items()})
        model = ShardedCausalLM(config, layout, group, dtype=dtype, include_mtp=include_mtp)
    del whole
    block = config.quantization.weight_block_size if config.quantization else fp8.DEFAULT_BLOCK
    slices = {name: slice_for(name, config, layout) for name in model.state_dict()}
    if fp8_weights == "resident":
        resident = {
            name
            for name, piece in slices.items()
            if entries[piece.source].dtype == "F8_E4M3" and _block_aligned(piece, entries, block)
        }
        make_resident(model, resident, block)
    model.to_empty(device=device)
    targets = model.state_dict(keep_vars=True)
    with ExitStack() as stack, torch.no_grad():
        handles: dict[Path, Any] = {}

        def handle(path: Path) -> Any:
            if path not in handles:
                handles[path] = stack.enter_context(safe_open(path, framework="pt", device="cpu"))
            return handles[path]

        for name, target in targets.items():
            if name.endswith(SCALE_SUFFIX):
                weight = slices[name.removesuffix("_scale_inv")]
                scale = _read_scale(handle, entries, weight, block)
                target.data.copy_(scale)
                continue
            piece = slices.get(name, Slice(name))
            target.data.zero_()
            if piece.zero or target.numel() == 0:
                continue
            tensor = _read(handle, entries, piece)
            if tensor.dtype == fp8.FP8_DTYPE and target.dtype != fp8.FP8_DTYPE:
                tensor = _dequantize_slice(handle, entries, piece, tensor, block)
            rows = tensor.shape[0]  # a vocabulary share may be padded past the real rows
            target.data[:rows].copy_(tensor)
    prepare_for_kernels(model)
    report = LoadReport(layout.rank, num_parameters_bytes(model), peak_memory_bytes(device))
    logger.info(
        "rank %d loaded its shard: %.1f MiB of weights, peak %.1f MiB",
        layout.rank,
        report.weight_bytes / 2**20,
        report.peak_bytes / 2**20,
        extra={"rank": layout.rank, "weight_bytes": report.weight_bytes,
               "peak_bytes": report.peak_bytes},
    )  # fmt: skip
    return model.eval(), report


def peak_memory_bytes(device: torch.device | str) -> int:
    """The process's peak memory so far: the CUDA allocator's on a GPU, else the resident set."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _read(handle: Any, entries: dict[str, TensorEntry], piece: Slice) -> Tensor:
    view = handle(entries[piece.source].file).get_slice(piece.source)
    if piece.dim is None:
        return view[:]
    if piece.dim == 0:
        return view[piece.start : piece.stop]
    return view[:, piece.start : piece.stop]


def _scale_span(piece: Slice, block: tuple[int, int]) -> tuple[int, int]:
    """Scale-grid rows (dim 0) or columns (dim 1) covering the slice."""
    assert piece.dim is not None
    size = block[piece.dim]
    return piece.start // size, -(-piece.stop // size)


def _read_scale(
    handle: Any, entries: dict[str, TensorEntry], weight: Slice, block: tuple[int, int]
) -> Tensor:
    """The scale grid of an FP8 weight's slice (block-aligned slices only)."""
    scale = Slice(weight.source.removesuffix(".weight") + SCALE_SUFFIX)
    if weight.dim is None:
        return _read(handle, entries, scale)
    start, stop = _scale_span(weight, block)
    return _read(handle, entries, Slice(scale.source, weight.dim, start, stop))


def _dequantize_slice(
    handle: Any,
    entries: dict[str, TensorEntry],
    piece: Slice,
    weight: Tensor,
    block: tuple[int, int],
) -> Tensor:
    """An FP8 slice in fp32, with the scale blocks covering it (the slice may cut a block)."""
    scales = _read_scale(handle, entries, piece, block).float()
    if piece.dim is None:
        return fp8.dequantize(weight, scales, block)
    offset = piece.start - _scale_span(piece, block)[0] * block[piece.dim]
    rows, cols = weight.shape
    expanded = scales.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    if piece.dim == 0:
        expanded = expanded[offset : offset + rows, :cols]
    else:
        expanded = expanded[:rows, offset : offset + cols]
    return weight.float() * expanded


def _block_aligned(piece: Slice, entries: dict[str, TensorEntry], block: tuple[int, int]) -> bool:
    """Whether the slice starts and ends on block boundaries (or the tensor's end)."""
    if piece.dim is None:
        return True
    size = block[piece.dim]
    length = entries[piece.source].shape[piece.dim]
    return piece.start % size == 0 and (piece.stop % size == 0 or piece.stop == length)
