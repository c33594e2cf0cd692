"""config.json parsing and checkpoint validation: every disagreement names tensor and shapes."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.demo_checkpoint import demo_config, write_demo_checkpoint
from backend.model.checkpoint import CheckpointError, load_generation_config, load_model
from backend.model.config import ConfigError, ModelConfig

SMALL_VOCAB = {"vocab_size": 512, "num_hidden_layers": 2}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base")
    return write_demo_checkpoint(out, "tiny", overrides=SMALL_VOCAB, tokenizer=False)


@pytest.fixture
def model_dir(base_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base_dir, tmp_path / "ckpt"))


def _edit_config(model_dir: Path, **changes: Any) -> None:
    path = model_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _index(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "model.safetensors.index.json").read_text())


def _write_index(model_dir: Path, index: dict[str, Any]) -> None:
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))


def _rewrite_shard(model_dir: Path, filename: str, tensors: dict[str, torch.Tensor]) -> None:
    save_file(tensors, model_dir / filename, metadata={"format": "pt"})


def test_hf_spelling_parses_like_deepseek_spelling() -> None:
    deepseek = demo_config("tiny")
    hf = {k: v for k, v in deepseek.items() if k not in ("rope_scaling", "rope_theta")}
    rope = {k: v for k, v in deepseek["rope_scaling"].items() if k != "type"}
    hf["rope_parameters"] = {**rope, "rope_type": "yarn", "rope_theta": deepseek["rope_theta"]}
    hf["dtype"] = "bfloat16"
    assert ModelConfig.from_dict(hf) == ModelConfig.from_dict(
        {**deepseek, "torch_dtype": "bfloat16"}
    )
    config = ModelConfig.from_dict(hf)
    assert config.rope.is_yarn and config.rope.original_max_position_embeddings == 256
    assert config.latent_dim == 40 and config.num_cache_layers == 4
    assert config.moe_layer_indices == [1, 2]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"topk_group": 5}, "topk_group 5 exceeds n_group 4"),
        ({"n_routed_experts": 10}, "not divisible by n_group"),
        ({"topk_method": "greedy"}, "noaux_tc"),
        ({"kv_lora_rank": None}, "lacks kv_lora_rank"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "not supported"),
        ({"num_key_value_heads": 1}, "num_key_value_heads"),
    ],
)
def test_invalid_config_raises(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict({**demo_config("tiny"), **changes})


def test_expert_count_mismatch(tmp_path: Path) -> None:
    overrides = {**SMALL_VOCAB, "n_routed_experts": 256}
    model_dir = write_demo_checkpoint(tmp_path, "tiny", overrides=overrides, tokenizer=False)
    _edit_config(model_dir, n_routed_experts=128)
    with pytest.raises(CheckpointError) as caught:
        load_model(model_dir)
    message = str(caught.value)
    assert "model.layers.1.mlp.gate.weight" in message
    assert "(128, 64)" in message and "(256, 64)" in message
    assert "n_routed_experts=128" in message


def test_wrong_kv_lora_rank(model_dir: Path) -> None:
    _edit_config(model_dir, kv_lora_rank=48)
    with pytest.raises(CheckpointError) as caught:
        load_model(model_dir)
    message = str(caught.value)
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in message
    assert "(56, 64)" in message and "(40, 64)" in message and "kv_lora_rank=48" in message


def test_missing_tensor(model_dir: Path) -> None:
    name = "model.layers.0.self_attn.o_proj.weight"
    index = _index(model_dir)
    filename = index["weight_map"].pop(name)
    tensors = load_file(model_dir / filename)
    del tensors[name]
    _rewrite_shard(model_dir, filename, tensors)
    _write_index(model_dir, index)
    with pytest.raises(
        CheckpointError, match=rf"missing tensor {name} \(expected shape \(64, 64\)\)"
    ):
        load_model(model_dir)


def test_unexpected_tensor(model_dir: Path) -> None:
    name = "model.layers.0.self_attn.rotary.inv_freq"
    index = _index(model_dir)
    filename = index["weight_map"]["model.norm.weight"]
    tensors = load_file(model_dir / filename)
    tensors[name] = torch.zeros(4)
    _rewrite_shard(model_dir, filename, tensors)
    index["weight_map"][name] = filename
    _write_index(model_dir, index)
    with pytest.raises(CheckpointError, match=rf"unexpected tensor {name} with shape \(4,\)"):
        load_model(model_dir)


def test_truncated_shard(model_dir: Path) -> None:
    shard = model_dir / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    pattern = r"model-00002-of-00002.safetensors is truncated: tensor \S+ \([\d, ]+\) ends at byte"
    with pytest.raises(CheckpointError, match=pattern):
        load_model(model_dir)


def test_index_entry_naming_absent_tensor(model_dir: Path) -> None:
    index = _index(model_dir)
    name = "model.layers.0.input_layernorm.weight"
    shards = sorted(set(index["weight_map"].values()))
    wrong = next(f for f in shards if f != index["weight_map"][name])
    index["weight_map"][name] = wrong
    _write_index(model_dir, index)
    with pytest.raises(CheckpointError, match=f"index names tensor {name} in {wrong}"):
        load_model(model_dir)


def test_index_entry_naming_missing_file(model_dir: Path) -> None:
    index = _index(model_dir)
    index["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors"
    _write_index(model_dir, index)
    with pytest.raises(CheckpointError, match="model-00003-of-00002.safetensors is missing"):
        load_model(model_dir)


def test_load_logs_attention_summary_and_skips_mtp_on_request(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="backend.model.checkpoint"):
        model = load_model(model_dir, load_mtp=False)
    assert "attention=MLA kv_lora_rank=32 rope_dim=8 cache_bytes_per_token=320" in caplog.text
    assert model.num_mtp_layers == 0 and model.num_cache_layers == 2
    assert len(model.model.layers) == 2
    assert load_model(model_dir).num_mtp_layers == 1


def test_single_file_checkpoint(model_dir: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(model_dir.glob("model-*.safetensors")):
        tensors.update(load_file(shard))
        shard.unlink()
    (model_dir / "model.safetensors.index.json").unlink()
    save_file(tensors, model_dir / "model.safetensors")
    model = load_model(model_dir)
    torch.testing.assert_close(
        model.lm_head.weight, tensors["lm_head.weight"].float(), rtol=0, atol=0
    )


def test_generation_config(model_dir: Path) -> None:
    defaults = load_generation_config(model_dir)
    assert (defaults.temperature, defaults.top_p) == (0.6, 0.95)
    assert defaults.bos_token_id == 0 and defaults.eos_token_ids == (1,)
