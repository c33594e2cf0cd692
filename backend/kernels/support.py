"""Whether the Triton kernels can run, decided without importing triton at module import.

Kernels run on CUDA tensors, or on CPU tensors when ``TRITON_INTERPRET=1`` (Triton's interpreter,
used by the tests). The model asks ``use_kernels`` before it calls a wrapper; the wrappers ask
``check_device`` and raise when neither holds.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache

from torch import Tensor


@cache
def triton_installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # blocked or half-installed
        return False


def interpreting() -> bool:
    """Triton's interpreter is on (it reads the variable when a kernel is defined)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_kernels(tensor: Tensor) -> bool:
    """The model's switch: Triton kernels for CUDA tensors when triton is installed."""
    return tensor.is_cuda and triton_installed()


def check_device(*tensors: Tensor) -> None:
    """All tensors on one device, where a kernel can run (CUDA, or CPU under the interpreter)."""
    if not triton_installed():
        raise RuntimeError("triton is not installed; the torch reference path must be used")
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"tensors on several devices: {sorted(str(d) for d in devices)}")
    device = devices.pop()
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"kernels run on CUDA tensors (or on CPU with TRITON_INTERPRET=1), got {device}"
        )


def upcast_loads(tensor: Tensor) -> bool:
    """Kernels convert loaded tiles to fp32 where bf16/fp8 dot products are not native: always
    under the interpreter (it mishandles bf16 arithmetic), never on CUDA."""
    return not tensor.is_cuda


def check_contiguous_rows(name: str, tensor: Tensor) -> None:
    """The kernels index rows by stride and expect unit stride along the last dimension."""
    if tensor.stride(-1) != 1:
        raise ValueError(f"{name} needs unit stride in its last dimension, got {tensor.stride()}")
