"""``python -m backend.plan``: weights by precision, latent cache per token and what fits,
checked by hand against DeepSeek-V3.1's config and exactly against a demo checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backend.demo_checkpoint import demo_config
from backend.engine.engine_config import EngineConfig
from backend.model.checkpoint import read_index
from backend.model.config import ModelConfig
from backend.model.footprint import activation_bytes_per_token, weight_bytes
from backend.model.model import DeepseekV3ForCausalLM
from backend.plan import GB, main, make_plan
from tests.support.plan import V31


@pytest.fixture(scope="module")
def v31_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("v31") / "config.json"
    path.write_text(json.dumps(demo_config("tiny", V31)))
    return path


def test_v31_by_hand(v31_config: Path) -> None:
    config = ModelConfig.from_file(v31_config)
    plan = make_plan(config, gpus=8, gpu_memory_bytes=int(141 * GB), include_mtp=False)
    # 671 B parameters without the MTP layer; FP8 linears 669.07 B at one byte plus an fp32
    # scale per 128x128 block; embedding, lm_head, routers and norms (1.96 B) in bf16.
    assert 671.0e9 < plan.weights.total_params < 671.1e9
    assert 669.0e9 < plan.weights.params["fp8"] < 669.1e9
    assert plan.weights.bytes["fp8"] == pytest.approx(plan.weights.params["fp8"] * (1 + 4 / 128**2))
    assert 672 * GB < plan.weights.total_bytes < 674 * GB  # about 671 GB in FP8
    assert 1341 * GB < plan.weights_dequantized.total_bytes < 1343 * GB  # 1.34 TB in bf16
    assert plan.cache_bytes_per_token == 61 * 576 * 2 == 70_272
    left = int(141 * GB) - plan.weights_per_gpu - plan.activation_bytes - plan.logits_bytes
    left -= plan.reserve_bytes
    assert plan.cache_tokens == left // 70_272 // 64 * 64 and plan.fits
    budget = EngineConfig().max_batch_tokens  # the engine's default batch token budget
    assert plan.activation_bytes == budget * activation_bytes_per_token(config, torch.bfloat16)
    with_mtp = make_plan(config, gpus=8, gpu_memory_bytes=int(141 * GB))
    assert with_mtp.cache_bytes_per_token == 62 * 576 * 2


def test_v31_dequantized_does_not_fit_eight_h200(
    v31_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(v31_config), "--gpus", "8", "--gpu-memory-gb", "141"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "FP8 resident" in out and "70,272" in out and "fits" in out
    assert main([*argv, "--fp8-weights", "dequantize"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True


def test_counts_match_a_real_checkpoint(tiny_fp8_dir: Path, tiny_dir: Path) -> None:
    config = ModelConfig.from_file(tiny_fp8_dir)
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(config, include_mtp=True)
    counted = weight_bytes(config, fp8_resident=True, dtype=torch.bfloat16)
    assert counted.total_params == sum(t.numel() for t in model.state_dict().values())
    for directory, resident in ((tiny_fp8_dir, True), (tiny_dir, False)):
        stored = read_index(directory)
        size = sum(
            torch.Size(e.shape).numel()
            * (1 if e.dtype == "F8_E4M3" else 4 if e.dtype == "F32" else 2)
            for e in stored.values()
        )
        expected = weight_bytes(
            ModelConfig.from_file(directory), fp8_resident=resident, dtype=torch.bfloat16
        )
        assert expected.total_bytes == size


def test_unreadable_config_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err
