"""ModelRunner and EngineConfig: pool sizing, batch building, which rows sample."""

from __future__ import annotations

import pytest
import torch

from backend.engine.engine_config import EngineConfig, max_model_len, num_cache_blocks
from backend.engine.request import Request
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import ScheduledSeq, SchedulerOutput
from backend.engine.step_batch import build_batch
from backend.generate import logits_for
from backend.model.cache import ForwardBatch
from backend.model.model import DeepseekV3ForCausalLM
from tests.support.engine import (
    engine_config,
    make_runner,
)


def _seq(request_id: str, tokens: list[int], table: list[int], params: SamplingParams) -> Request:
    seq = Request(request_id, tokens, params)
    seq.block_table = table
    return seq


def _scheduled(seq: Request, start: int, num_new_tokens: int) -> ScheduledSeq:
    seq.num_computed_tokens = start
    return ScheduledSeq.of(seq, num_new_tokens)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_num_seqs", 0),
        ("block_size", 0),
        ("cache_memory_bytes", 0),
        ("max_waiting", 0),
        ("dtype", "float64"),
        ("num_threads", 0),
        ("max_model_len", 1),
        ("device", "no-such-device"),
    ],
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})


def test_config_needs_a_decode_token_per_sequence() -> None:
    with pytest.raises(ValueError, match="max_batch_tokens"):
        EngineConfig(max_num_seqs=8, max_batch_tokens=4)


def test_pool_size_counts_every_cache_layer_including_mtp(
    tiny_model: DeepseekV3ForCausalLM,
) -> None:
    config = engine_config(block_size=16, cache_memory_bytes=1_000_000)
    layers = tiny_model.config.num_hidden_layers + tiny_model.config.num_nextn_predict_layers
    per_block = layers * tiny_model.config.latent_dim * 4 * 16
    assert num_cache_blocks(config, tiny_model.config, mtp=True) == 1_000_000 // per_block
    runner = make_runner(tiny_model, config)
    assert runner.num_blocks == 1_000_000 // per_block
    assert tuple(runner.cache.kv.shape) == (
        layers,
        runner.num_blocks * 16,
        tiny_model.config.latent_dim,
    )
    with pytest.raises(ValueError, match="below one block"):
        num_cache_blocks(
            engine_config(cache_memory_bytes=per_block - 1), tiny_model.config, mtp=True
        )


def test_max_model_len_takes_the_tightest_limit(tiny_model: DeepseekV3ForCausalLM) -> None:
    positions = tiny_model.config.max_position_embeddings
    assert max_model_len(engine_config(), tiny_model.config, 10_000) == positions
    assert max_model_len(engine_config(), tiny_model.config, 10) == 160
    assert max_model_len(engine_config(max_model_len=100), tiny_model.config, 10_000) == 100
    unchunked = engine_config(chunked_prefill=False, max_batch_tokens=300)
    assert max_model_len(unchunked, tiny_model.config, 10_000) == 300


def test_runner_rejects_a_model_in_another_dtype(tiny_model: DeepseekV3ForCausalLM) -> None:
    with pytest.raises(ValueError, match="bfloat16"):
        make_runner(tiny_model, engine_config(dtype="bfloat16"))


def test_batch_mixes_chunks_and_decodes_over_scattered_blocks(
    tiny_model: DeepseekV3ForCausalLM,
) -> None:
    runner = make_runner(tiny_model, engine_config(block_size=4))
    greedy = SamplingParams(temperature=0.0)
    decode = _seq("a", list(range(2, 9)), [7, 3], greedy)  # 7 tokens, the last one new
    chunk = _seq("b", list(range(20, 31)), [5, 0, 9], greedy)  # tokens 2..9 of 11 this step
    scheduled = [_scheduled(decode, 6, 1), _scheduled(chunk, 2, 8)]
    batch = build_batch(scheduled, runner.block_size, runner.device)
    assert batch.input_ids.tolist() == [8, *range(22, 30)]
    assert batch.positions.tolist() == [6, *range(2, 10)]
    expected_slots = ForwardBatch.slots_for([7, 3], 6, 1, 4) + ForwardBatch.slots_for(
        [5, 0, 9], 2, 8, 4
    )
    assert batch.slot_mapping.tolist() == expected_slots
    assert batch.seq_lens_q == [1, 8]
    assert batch.context_lens == [7, 10]


def test_only_rows_that_complete_a_sequence_sample(tiny_model: DeepseekV3ForCausalLM) -> None:
    runner = make_runner(tiny_model, engine_config(block_size=4))
    greedy = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=2)
    prompt_a, prompt_b = [3, 9, 27, 81, 243], [5, 25, 125, 11, 55, 275]
    whole = _seq("a", prompt_a, [0, 1], greedy)
    partial = _seq("b", prompt_b, [2, 3], greedy)
    step = SchedulerOutput([_scheduled(whole, 0, 5), _scheduled(partial, 0, 4)], [])
    result = runner.execute(step)
    expected = int(logits_for(tiny_model, prompt_a)[-1].argmax())
    assert result.sampled_tokens == [[expected], []]
    assert result.logprobs[0] is not None and result.logprobs[1] is None
    [first] = result.logprobs[0]  # one entry per sampled token
    assert first.top[0][0] == expected and len(first.top) == 2
    rest = SchedulerOutput([_scheduled(partial, 4, 2)], [])
    assert runner.execute(rest).sampled_tokens == [
        [int(logits_for(tiny_model, prompt_b)[-1].argmax())]
    ]


def test_seeded_generator_lives_until_release(tiny_model: DeepseekV3ForCausalLM) -> None:
    runner = make_runner(tiny_model, engine_config(block_size=8))
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=1234)
    seq = _seq("s", [4, 8, 15, 16, 23, 42], [0], params)
    step = SchedulerOutput([_scheduled(seq, 0, 6)], [])
    draws = [runner.execute(step).sampled_tokens[0][0] for _ in range(6)]
    runner.release("s")
    again = [runner.execute(step).sampled_tokens[0][0] for _ in range(6)]
    assert draws == again  # a fresh generator after release replays the same draws
    assert len(set(draws)) > 1  # while one generator lives, each draw advances it


def test_step_writes_only_the_new_tokens_slots(tiny_model: DeepseekV3ForCausalLM) -> None:
    runner = make_runner(tiny_model, engine_config(block_size=8))
    seq = _seq("g", [1, 2, 3], [2], SamplingParams(temperature=0.0))
    runner.execute(SchedulerOutput([_scheduled(seq, 0, 3)], []))
    kv = runner.cache.kv  # [layers, slots, latent]
    decoder_layers = tiny_model.config.num_hidden_layers
    written = kv[:decoder_layers, 16:19]
    assert bool((written.abs().sum(dim=-1) > 0).all())
    untouched = torch.cat((kv[:, :16], kv[:, 19:]), dim=1)
    assert torch.count_nonzero(untouched) == 0
    assert torch.count_nonzero(kv[decoder_layers:]) == 0  # the MTP layer is not run here
