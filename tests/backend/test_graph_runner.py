"""Decode steps padded to batch buckets over static buffers (the CUDA-graph runner's logic, run
eagerly on the CPU where capture does not apply): buckets, buffers, padding, and outputs equal
to unpadded eager steps and to HF transformers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from backend.engine.engine_config import EngineConfig
from backend.engine.graph_runner import (
    DecodeBuffers,
    bucket_sizes,
    choose_bucket,
    graph_modes,
    num_pad_blocks,
)
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.cache import ForwardBatch
from backend.model.model import DeepseekV3ForCausalLM
from tests.support.engine import GREEDY, engine_config, make_engine, random_prompts, run_all
from tests.support.engine import tokens_of as _tokens


def test_buckets_double_then_step_by_eight() -> None:
    assert bucket_sizes(64, 256) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert bucket_sizes(64, 20) == (1, 2, 4, 8, 16, 20)
    assert bucket_sizes(3, 32) == (1, 2, 3)
    assert bucket_sizes(1, 32) == (1,)
    with pytest.raises(ValueError):
        bucket_sizes(0, 8)


def test_the_smallest_bucket_that_holds_the_batch() -> None:
    buckets = bucket_sizes(32, 32)
    assert [choose_bucket(buckets, n) for n in (1, 2, 3, 5, 8, 9, 17, 32)] == [
        1, 2, 4, 8, 8, 16, 24, 32,
    ]  # fmt: skip
    assert choose_bucket(buckets, 33) is None


def test_graph_modes_follow_the_settings_and_the_device() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert graph_modes(EngineConfig(), cpu) == (False, False)
    assert graph_modes(EngineConfig(), cuda) == (True, True)
    assert graph_modes(EngineConfig(decode_graphs="on"), cpu) == (True, False)
    assert graph_modes(EngineConfig(decode_graphs="off"), cuda) == (False, False)
    assert graph_modes(EngineConfig(tensor_parallel=2), cuda) == (False, False)
    # parallel ranks pad when asked, never capture; data-parallel attention runs as it is
    assert graph_modes(EngineConfig(tensor_parallel=2, decode_graphs="on"), cuda) == (True, False)
    dp = EngineConfig(tensor_parallel=2, decode_graphs="on", data_parallel_attention=True)
    assert graph_modes(dp, cpu) == (False, False)
    with pytest.raises(ValueError, match="decode_graphs"):
        EngineConfig(decode_graphs="always")


def test_buffers_pad_a_batch_into_the_padding_block() -> None:
    block_size = 4
    pad = [100 + i for i in range(num_pad_blocks(block_size))]
    buffers = DecodeBuffers(8, 2, 5, block_size, pad, max_len=20, device=torch.device("cpu"))
    # three sequences verifying one draft each: 2 new tokens at the end of their contexts
    batch = ForwardBatch.build(
        [[5, 6], [7, 8], [9, 10]], [1, 9, 0], [[1], [2, 3, 4], [6]], block_size
    )
    padded = buffers.fill(batch, 4, 2)
    assert padded.seq_lens_q == [2, 2, 2, 2]
    assert padded.input_ids.tolist() == [5, 6, 7, 8, 9, 10, 0, 0]
    assert padded.positions.tolist() == [1, 2, 9, 10, 0, 1, 0, 1]
    assert padded.slot_mapping.tolist()[:6] == batch.slot_mapping.tolist()
    assert padded.slot_mapping.tolist()[6:] == [400, 401]  # the padding block's first slots
    assert padded.context_lens == [3, 11, 2, 2]
    assert padded.block_tables[3] == pad
    layout = padded.decode
    assert layout is not None and layout.max_len == 20
    assert layout.token_seq.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert layout.token_len.tolist() == [2, 3, 10, 11, 1, 2, 1, 2]
    assert layout.block_tables.tolist() == [
        [1, 0, 0, 0, 0], [2, 3, 4, 0, 0], [6, 0, 0, 0, 0], [*pad, 0, 0, 0, 0],
    ]  # fmt: skip
    # tensors view the static buffers: a later step overwrites them in place
    assert padded.input_ids.data_ptr() == buffers.input_ids.data_ptr()
    mixed = ForwardBatch.build([[1], [2, 3]], [0, 0], [[1], [2]], block_size)
    wide = ForwardBatch.build([[1]], [0], [[1, 2, 3, 4, 5, 6]], block_size)
    too_many = ForwardBatch.build([[1]] * 9, [0] * 9, [[1]] * 9, block_size)
    assert not any(buffers.fits(b) for b in (mixed, wide, too_many))
    with pytest.raises(ValueError):
        buffers.fill(mixed, 4, 1)


def _run(
    engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams, stagger: int = 0
) -> dict[str, list[int]]:
    """Greedy tokens per request; with ``stagger``, request i asks for ``stagger * i`` more
    tokens, so the batch shrinks step by step through the buckets."""
    requests = (
        (rid, prompt, replace(params, max_tokens=(params.max_tokens or 1) + stagger * i))
        for i, (rid, prompt) in enumerate(prompts.items())
    )
    outputs = run_all(engine, requests)
    return {rid: _tokens(outs) for rid, outs in outputs.items()}


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "mtp"])
def test_padded_decode_steps_equal_eager_ones(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path, spec: bool
) -> None:
    prompts = random_prompts(11, 3, 40, seed=21)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    knobs = {"spec_enabled": spec, "spec_max_batch_size": None, "max_num_seqs": 16}
    eager = _run(make_engine(tiny_model, tiny_dir, engine_config(**knobs)), prompts, params, 2)
    # buckets 1, 2, 4, 8: 11 sequences run unpadded (beyond the largest), then fewer padded
    config = engine_config(decode_graphs="on", decode_graph_max_batch=8, **knobs)
    engine = make_engine(tiny_model, tiny_dir, config)
    assert engine.graph_report is not None and engine.graph_report.num_graphs == 0
    assert engine.graph_report.q_lens == ((1, 2) if spec else (1,))
    assert _run(engine, prompts, params, 2) == eager
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.num_padded_eager > 0
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks  # the padding block is no one's
    if spec:
        assert stats.spec_verified_tokens_total > 0


def test_padded_greedy_matches_hf_transformers(
    tiny_model: DeepseekV3ForCausalLM, tiny_dir: Path
) -> None:
    from transformers import DeepseekV3ForCausalLM as HFDeepseekV3  # slow import: only here

    reference = HFDeepseekV3.from_pretrained(tiny_dir, dtype=torch.float32)
    prompts = random_prompts(3, 5, 40, seed=1)
    config = engine_config(decode_graphs="on", spec_max_batch_size=None)
    got = _run(make_engine(tiny_model, tiny_dir, config), prompts, GREEDY)
    for rid, prompt in prompts.items():
        out = reference.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=GREEDY.max_tokens,
            min_new_tokens=GREEDY.max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        assert got[rid] == out[0, len(prompt) :].tolist(), rid


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("spec", [False, True], ids=["plain", "mtp"])
def test_captured_graphs_replay_the_eager_tokens(tiny_dir: Path, spec: bool) -> None:
    from backend.model.checkpoint import load_model

    model = load_model(tiny_dir, dtype=torch.float32, device="cuda")
    prompts = random_prompts(11, 3, 40, seed=21)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    knobs = {
        "device": "cuda", "spec_enabled": spec, "spec_max_batch_size": None, "max_num_seqs": 16,
    }  # fmt: skip
    eager_config = engine_config(decode_graphs="off", **knobs)
    eager = _run(make_engine(model, tiny_dir, eager_config), prompts, params, 2)
    config = engine_config(decode_graphs="auto", decode_graph_max_batch=8, **knobs)
    engine = make_engine(model, tiny_dir, config)
    report = engine.graph_report
    assert report is not None and not report.failed
    assert report.num_graphs == len(report.buckets) * len(report.q_lens)
    assert _run(engine, prompts, params, 2) == eager
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.num_replays > 0
