"""``python -m backend.plan`` over several GPUs: the recommended layout for DeepSeek-V3.1 on
8 x H200 (fits), 8 x H100 (does not) and 2 x 8 x H100 (fits), and its weights per GPU counted
as the parallel loader slices them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from backend.demo_checkpoint import demo_config
from backend.engine.engine_config import EngineConfig
from backend.model.config import ModelConfig
from backend.parallel.layout import Layout
from backend.parallel.sizing import decode_step_bytes, rank_weight_bytes
from backend.plan import GB, main
from tests.support.plan import V31


@pytest.fixture(scope="module")
def v31(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("v31-layout") / "config.json"
    path.write_text(json.dumps(demo_config("tiny", V31)))
    return path


def _layout(
    v31: Path, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, dict[str, Any]]:
    code = main(["--model", str(v31), "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_v31_layouts(v31: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, h200 = _layout(v31, capsys, "--gpus", "8", "--gpu-memory-gb", "141")
    layout = h200["layout"]
    assert code == 0 and h200["fits"] and layout["expert_parallel"] and layout["world"] == 8
    # 686.6 GB over 8 plus what every rank holds whole (latent projections, router, norms,
    # MTP's eh_proj) and rank 0's MTP head: about 88.6 GB on rank 0
    assert 85.8 * GB < layout["worker_weight_bytes"] < layout["root_weight_bytes"] < 90 * GB
    assert layout["cache_tokens"] > 600_000
    code, h100 = _layout(v31, capsys, "--gpus", "8", "--gpu-memory-gb", "80")
    assert code == 1 and not h100["fits"] and h100["layout"]["cache_tokens"] == 0
    code, two = _layout(v31, capsys, "--gpus", "8", "--nodes", "2", "--gpu-memory-gb", "80")
    assert code == 0 and two["layout"]["world"] == 16 and two["layout"]["cache_tokens"] > 400_000
    main(["--model", str(v31), "--gpus", "8", "--nodes", "2", "--gpu-memory-gb", "80"])
    text = capsys.readouterr().out
    assert "tensor_parallel = 16, expert_parallel = true, parallel_local_ranks = 8" in text
    assert "across nodes" in text and "layout fits" in text


def test_decode_step_bytes_by_hand(v31: Path) -> None:
    config = ModelConfig.from_file(v31)
    step = decode_step_bytes(config, 8, expert_parallel=True, num_seqs=1, rank=1)
    row = 7168 * 2  # one token's hidden state in bf16
    assert step.all_reduce == (1 + 2 * 61) * (2 * 7 * row // 8)
    pairs = 8 / 8 * 7 / 8  # one token's 8 experts, dispatched by one of 8 ranks, 7/8 remote
    assert step.all_to_all == round(58 * (7 * 8 + pairs * (2 * row + 8)))
    assert step.logits == -(-129280 // 8) * 4 and step.plan == 0
    root = decode_step_bytes(config, 8, expert_parallel=True, num_seqs=1, rank=0)
    # to each of 7 workers: one 3-value header, the step's plan (T, S, ids, positions, slots,
    # new tokens, context, table length, one block) and one row number
    assert root.plan == 7 * (3 * 8 + (2 + 3 + 3 + 1) * 8 + 8) and root.logits == 0
    drafting = decode_step_bytes(config, 8, expert_parallel=True, num_seqs=1, drafts=1, rank=0)
    # two tokens a sequence (its last and a draft); a second header and each row's next token
    assert drafting.plan == 7 * (2 * 3 * 8 + (2 + 6 + 3 + 1) * 8 + 2 * 8 + 2 * 8)


def test_weights_per_rank_sum_to_the_model() -> None:
    # over ranks, the sliced tensors add up to the whole; the replicated ones count per rank
    tiny = ModelConfig.from_dict(demo_config("tiny"))
    total = sum(
        rank_weight_bytes(tiny, Layout(r, 2, True), dtype=torch.float32, include_mtp=False)
        for r in range(2)
    )
    one = rank_weight_bytes(tiny, Layout(0, 1), dtype=torch.float32, include_mtp=False)
    mla = tiny.mla
    replicated = 4 * (
        tiny.num_hidden_layers
        * (
            tiny.hidden_size * (mla.q_lora_rank or 0)  # q_a_proj
            + (mla.q_lora_rank or 0)  # q_a_layernorm
            + tiny.hidden_size * mla.latent_dim  # kv_a_proj_with_mqa
            + mla.kv_lora_rank  # kv_a_layernorm
            + 2 * tiny.hidden_size  # the two layer norms
        )
        + (tiny.num_hidden_layers - tiny.moe.first_k_dense_replace)
        * (tiny.moe.n_routed_experts * (tiny.hidden_size + 1))  # router weight and bias
        + tiny.hidden_size  # final norm
    )
    assert total == one + replicated


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tensor_parallel": 0}, "tensor_parallel must be positive"),
        ({"tensor_parallel": 2, "parallel_local_ranks": 3}, "parallel_local_ranks"),
        ({"tensor_parallel": 4, "parallel_local_ranks": 2}, "fixed parallel_master_port"),
        ({"parallel_timeout_s": 0}, "must be positive"),
        ({"data_parallel_attention": True}, "data_parallel_attention needs tensor_parallel"),
    ],
)
def test_parallel_settings_are_checked(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**settings)


def test_widths_that_do_not_split_are_refused_before_any_rank_starts(tiny_dir: Path) -> None:
    from backend.parallel.cluster import start_parallel_model

    config = EngineConfig(tensor_parallel=3, device="cpu", cache_memory_bytes=2 << 20)
    with pytest.raises(ValueError, match="num_attention_heads 4 does not split over"):
        start_parallel_model(tiny_dir, config)


def test_v31_both_layouts(v31: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Data-parallel attention: N GPUs' cache per node, 1/N of the latents read per GPU per
    decode step, at the cost of the attention's weights whole on every GPU."""
    code, h200 = _layout(v31, capsys, "--gpus", "8", "--gpu-memory-gb", "141")
    tp, dp = h200["layout"], h200["dp_layout"]
    assert code == 0 and dp["fits"] and dp["data_parallel_attention"]
    assert not tp["data_parallel_attention"] and tp["cache_tokens_per_node"] == tp["cache_tokens"]
    assert dp["cache_tokens_per_node"] == 8 * dp["cache_tokens"] > 6 * tp["cache_tokens_per_node"]
    config = ModelConfig.from_file(v31)
    mla = config.mla
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168  # q_b, kv_b, o: FP8 bytes
    assert mla.num_heads == 128
    extra = dp["worker_weight_bytes"] - tp["worker_weight_bytes"]
    # the 7/8 of those a GPU did not hold, over 61 layers and the MTP layer (+ scale grids)
    assert 62 * split * 7 / 8 < extra < 1.01 * 62 * split * 7 / 8
    latent = 32 * 32768 * 61 * 576 * 2  # batch 32, 32K tokens each, bf16
    tp_reads, dp_reads = tp["attention_reads"]["32"], dp["attention_reads"]["32"]
    assert tp_reads["latents"] == latent and dp_reads["latents"] == latent // 8
    # the attentions' rows join by all-gather (4 rows a GPU at batch 32): half the bytes of
    # the all-reduce they replace; the rest of the collectives as in the other layout
    tp32, dp32 = tp["steps"]["32"], dp["steps"]["32"]
    joins = 61 * 2 * 7 * (32 * 7168 * 2) // 8
    assert dp32["all_gather"] == 61 * 7 * 4 * 7168 * 2 == joins // 2
    assert dp32["all_reduce"] == tp32["all_reduce"] - joins
    assert dp32["all_to_all"] == tp32["all_to_all"] and dp32["plan"] == tp32["plan"]
    assert dp["steps"]["1"] == tp["steps"]["1"]  # one sequence: the all-reduce is cheaper
    code, h100 = _layout(v31, capsys, "--gpus", "8", "--gpu-memory-gb", "80")
    assert code == 1 and not h100["dp_layout"]["fits"]
    code, two = _layout(v31, capsys, "--gpus", "8", "--nodes", "2", "--gpu-memory-gb", "80")
    dp16 = two["dp_layout"]
    assert (
        dp16["cache_tokens_total"] == 2 * dp16["cache_tokens_per_node"] == 16 * dp16["cache_tokens"]
    )
    main(["--model", str(v31), "--gpus", "8", "--gpu-memory-gb", "141"])
    text = capsys.readouterr().out
    assert "data_parallel_attention = true" in text and "x 8 = " in text


def test_v31_cache_gain_per_byte_and_per_node(
    v31: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per byte of cache data-parallel attention holds 8 times the tokens (a token's latent on
    one GPU, not eight); per node less, by the attention weights each GPU holds whole: FP8 with
    their 128x128 scale grids, in the 61 decoder layers and the MTP layer, counted by hand."""
    code, h200 = _layout(v31, capsys, "--gpus", "8", "--gpu-memory-gb", "141")
    tp, dp, gain = h200["layout"], h200["dp_layout"], h200["dp_gain"]
    assert code == 0 and gain["per_byte"] == 8
    # q_b_proj, kv_b_proj and o_proj split by heads under tensor parallel: a GPU holds 1/8
    split = {(24576, 1536): (192, 12), (32768, 512): (256, 4), (7168, 16384): (56, 128)}
    fp8_bytes = sum(rows * cols for rows, cols in split)
    scale_bytes = 4 * sum(r * c - (r * c) // 8 for r, c in split.values())  # sliced by rows/8
    extra = 62 * (fp8_bytes * 7 // 8 + scale_bytes)
    assert (
        dp["worker_weight_bytes"] - tp["worker_weight_bytes"] == extra == gain["extra_weight_bytes"]
    )
    assert gain["dp_cache_bytes"] == gain["tp_cache_bytes"] - extra
    per_token = 62 * 576 * 2
    assert dp["cache_tokens"] == gain["dp_cache_bytes"] // per_token // 64 * 64
    assert gain["per_node"] == dp["cache_tokens_per_node"] / tp["cache_tokens_per_node"]
    assert 6.3 < gain["per_node"] < 6.5  # not 8: 9.3 GB of each GPU go to the attention
    main(["--model", str(v31), "--gpus", "8", "--gpu-memory-gb", "141"])
    text = capsys.readouterr().out
    assert "x8 per byte of cache" in text and "x6.42 per node after weights" in text
