"""Shared pieces of the parallel-engine tests: configs, worker processes, engine runs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import torch

from backend.engine.engine_config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.model import DeepseekV3ForCausalLM
from tests.support.engine import (
    GREEDY,
    engine_config,
    make_engine,
    random_prompts,
    run_all,
    tokens_of,
)
from tests.support.local_gateway import LocalGateway


def parallel_config(world: int, **overrides: Any) -> EngineConfig:
    """``engine_config`` (same pool) over ``world`` ranks, one thread per worker."""
    settings: dict[str, Any] = {
        "tensor_parallel": world,
        "num_threads": 1,
        "parallel_timeout_s": 60.0,
        "parallel_join_timeout_s": 120.0,
    }
    settings.update(overrides)
    return engine_config(**settings)


def worker_pids() -> dict[int, int]:
    """Rank -> pid of this process's worker ranks (``backend.parallel.worker`` children)."""
    me = str(os.getpid())
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = stat.rsplit(")", 1)[1].split()[1]
        if parent != me or b"backend.parallel.worker" not in argv:
            continue
        found[int(argv[argv.index(b"--rank") + 1])] = int(entry.name)
    return found


def greedy_tokens(
    engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams
) -> dict[str, list[int]]:
    outputs = run_all(engine, [(rid, prompt, params) for rid, prompt in prompts.items()])
    return {rid: tokens_of(out) for rid, out in outputs.items()}


def one_by_one(
    engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Each request run to completion before the next (so later ones hit the prefix cache):
    tokens and cached prompt tokens per request."""
    tokens: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    for rid, prompt in prompts.items():
        outputs = run_all(engine, [(rid, prompt, params)])[rid]
        tokens[rid] = tokens_of(outputs)
        cached[rid] = outputs[-1].num_cached_tokens
    return tokens, cached


def logits_by_step(
    model: DeepseekV3ForCausalLM, prompt: list[int], next_token: int
) -> list[torch.Tensor]:
    """A prefill's last-row logits, the next decode's logits and (with an MTP layer) the MTP
    hidden states of the prefill, over a fresh 4-block cache on the model's device."""
    config, device = model.config, model.device
    cache = PagedLatentCache(model.num_cache_layers, 4, 16, config.latent_dim, model.dtype, device)
    table = [2, 0, 3, 1]
    prefill = ForwardBatch.for_prefill(prompt, 0, table, 16, device)
    hidden = model(prefill, cache)
    first = model.compute_logits(hidden[-1:])
    out = [first]
    if model.num_mtp_layers:
        shifted = ForwardBatch.for_prefill(prompt[1:] + [next_token], 0, table, 16, device)
        out.append(model.mtp_forward(shifted, cache, hidden))
    decode = ForwardBatch.for_prefill([next_token], len(prompt), table, 16, device)
    out.append(model.compute_logits(model(decode, cache)))
    return out


def prefix_prompts(seed: int) -> dict[str, list[int]]:
    """Three prompts sharing a 40-token head, each with a tail of 3 to 9 tokens."""
    base = random_prompts(1, 40, 40, seed)["req-0"]
    tails = random_prompts(3, 3, 9, seed + 1)
    return {rid: base + tail for rid, tail in tails.items()}


def assert_greedy_as_one_device(
    single: DeepseekV3ForCausalLM,
    model: DeepseekV3ForCausalLM,
    model_dir: Path,
    prompts: dict[str, list[int]],
    one_device: dict[str, Any],
    runs: Sequence[dict[str, Any]],
    *,
    world: int,
    params: SamplingParams = GREEDY,
    **parallel: Any,
) -> None:
    """Under each run's engine settings, the parallel ``model`` (``world`` ranks, ``parallel``
    settings) gives the greedy tokens the single-device model gives under ``one_device``'s; a
    speculative run proposes drafts."""
    reference = make_engine(single, model_dir, engine_config(**one_device))
    expected = greedy_tokens(reference, prompts, params)
    for overrides in runs:
        engine = make_engine(model, model_dir, parallel_config(world, **parallel, **overrides))
        assert greedy_tokens(engine, prompts, params) == expected, overrides
        if overrides.get("spec_enabled"):
            assert engine.stats().spec_proposed_tokens_total > 0


def assert_prefix_hits_as_one_device(
    single: DeepseekV3ForCausalLM,
    model: DeepseekV3ForCausalLM,
    model_dir: Path,
    prompts: dict[str, list[int]],
    one_device: dict[str, Any],
    ranks: dict[str, Any],
) -> None:
    """``prompts`` (a shared 40-token head, then short tails) one after another: the same
    tokens as one device, the later ones served from the prefix cache."""
    expected, _ = one_by_one(
        make_engine(single, model_dir, engine_config(**one_device)), prompts, GREEDY
    )
    tokens, cached = one_by_one(
        make_engine(model, model_dir, parallel_config(2, **ranks)), prompts, GREEDY
    )
    assert tokens == expected
    assert cached["req-0"] == 0 and cached["req-1"] >= 32 and cached["req-2"] >= 32


def assert_logits_close(
    model: DeepseekV3ForCausalLM,
    single: DeepseekV3ForCausalLM,
    prompt: list[int],
    next_token: int,
    atol: float,
) -> None:
    """``logits_by_step`` of both models agree within ``atol``."""
    ours, theirs = (
        logits_by_step(model, prompt, next_token),
        logits_by_step(single, prompt, next_token),
    )
    for got, want in zip(ours, theirs, strict=True):
        assert got.device == want.device and got.shape == want.shape
        torch.testing.assert_close(got, want, atol=atol, rtol=0)


USER = [{"role": "user", "content": "Tell me about rivers and the sea."}]


def client(gateway: LocalGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.key, max_retries=0)


async def answers(gateway: LocalGateway) -> list[Any]:
    """One chat answer and one streamed reasoning answer, as compared across engines."""
    sdk = client(gateway)
    plain = await sdk.chat.completions.create(
        model="deepseek-chat", messages=USER, max_tokens=12, temperature=0
    )
    stream = await sdk.chat.completions.create(
        model="deepseek-reasoner",
        messages=USER,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, reasoning, usage = [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
    message = plain.choices[0].message
    return [
        message.content,
        plain.choices[0].finish_reason,
        plain.usage.completion_tokens if plain.usage else None,
        "".join(text),
        "".join(reasoning),
        usage,
    ]
