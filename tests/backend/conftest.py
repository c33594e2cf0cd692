"""Tiny random DeepSeek-V3 checkpoints, written once per session, and models loaded from them.

torch is imported inside the fixtures, so the torch-free scheduler and block manager tests run
without it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from backend.model.model import DeepseekV3ForCausalLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The "tiny" preset in bf16 storage: YaRN ramp active, grouped routing, MTP layer."""
    from backend.demo_checkpoint import write_demo_checkpoint

    return write_demo_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=0, tokenizer=False)


@pytest.fixture(scope="session")
def tiny_fp8_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same source weights as ``tiny_dir``, stored as block-scaled FP8."""
    from backend.demo_checkpoint import write_demo_checkpoint

    return write_demo_checkpoint(
        tmp_path_factory.mktemp("tiny_fp8"), "tiny", seed=0, use_fp8=True, tokenizer=False
    )


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> DeepseekV3ForCausalLM:
    import torch

    from backend.model.checkpoint import load_model

    return load_model(tiny_dir, dtype=torch.float32)
