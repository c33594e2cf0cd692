"""Tiny random DeepSeek-V3 checkpoints, written once per session, and models loaded from them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from backend.demo_checkpoint import write_demo_checkpoint
from backend.model.checkpoint import load_model
from backend.model.model import DeepseekV3ForCausalLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The "tiny" preset in bf16 storage: YaRN ramp active, grouped routing, MTP layer."""
    return write_demo_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=0, tokenizer=False)


@pytest.fixture(scope="session")
def tiny_fp8_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same source weights as ``tiny_dir``, stored as block-scaled FP8."""
    return write_demo_checkpoint(
        tmp_path_factory.mktemp("tiny_fp8"), "tiny", seed=0, use_fp8=True, tokenizer=False
    )


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> DeepseekV3ForCausalLM:
    return load_model(tiny_dir, dtype=torch.float32)
