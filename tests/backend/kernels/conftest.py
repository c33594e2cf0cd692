"""Kernel tests run the Triton code on CUDA when a GPU is present, else under Triton's
interpreter on the CPU. The interpreter is chosen when a kernel is defined, so the variable is
set here, before any test imports a kernel module."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def act_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA; fp32 under the interpreter, which mishandles bf16 arithmetic."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32
