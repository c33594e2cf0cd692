"""The torch dtypes the engine computes in, by the names that settings and config.json use.

Torch-free at import: the gateway validates dtype names without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")

# How a loader treats an FP8 checkpoint's linears: kept e4m3 in memory, or converted at load.
FP8Weights = Literal["resident", "dequantize"]
FP8_WEIGHT_MODES: tuple[FP8Weights, ...] = ("resident", "dequantize")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called `name`; ValueError for a name not in DTYPE_NAMES."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype {name!r} is not one of {list(DTYPE_NAMES)}")
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a served dtype, as config.json writes it."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype {name!r} is not one of {list(DTYPE_NAMES)}")
    return name
