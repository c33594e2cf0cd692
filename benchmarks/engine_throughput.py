"""Engine benchmark on the "small" demo preset (random weights), in one run.

    python -m benchmarks.engine_throughput [--device cpu|cuda] [--dtype ...] [--parts abc]

(a) Offline throughput: 64 requests (prompts of 128 to 512 random tokens, 128 output tokens,
    greedy, EOS ignored) through the engine, against HF transformers `generate()` one request
    at a time and in left-padded batches of 8. HF runs are subsampled (`--hf-single`,
    `--hf-batches`) and extrapolated to 64 requests; the output says so.
(b) Latency through the gateway (the real app, in process, with the local provider): time to
    first token and time per output token at 1, 8 and 32 concurrent streams.
(c) Prefill of a 4,096-token prompt cold, and with its first 3,584 tokens in the prefix cache
    (read from the paged cache chunk by chunk; beside it the dense path it replaced).

Targets: engine >= 8x HF one-at-a-time, >= 2x HF padded batches; a cached prefix cuts TTFT >= 5x.
Random weights make the output meaningless but the work identical to a trained model's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import torch

from backend.engine.engine_config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model import mla
from backend.model.checkpoint import load_generation_config, load_model
from backend.model.model import DeepseekV3ForCausalLM
from providers.local.setup import resolve_checkpoint

NUM_REQUESTS = 64
PROMPT_RANGE = (128, 512)
OUTPUT_TOKENS = 128
HF_BATCH = 8
LONG_PROMPT = 4096
CACHED_PREFIX = 3584
CONCURRENCY = (1, 8, 32)
STREAM_OUTPUT_TOKENS = 64
REPEATS = 3
TOKEN_RANGE = (1000, 120_000)  # ordinary vocabulary ids, no control tokens


def random_prompts(rng: random.Random, count: int) -> list[list[int]]:
    return [
        [rng.randrange(*TOKEN_RANGE) for _ in range(rng.randint(*PROMPT_RANGE))]
        for _ in range(count)
    ]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def engine_config(device: str, dtype: str) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=NUM_REQUESTS,
        max_batch_tokens=LONG_PROMPT,
        block_size=64,
        cache_memory_bytes=512 << 20,
        dtype=dtype,
        device=device,
    )


def build_engine(model: DeepseekV3ForCausalLM, checkpoint: Path, config: EngineConfig) -> LLMEngine:
    return LLMEngine(
        model,
        config,
        hash_seed=b"benchmark",
        generation_defaults=load_generation_config(checkpoint),
    )


def run_engine(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> int:
    """Run the prompts to completion; the number of generated tokens."""
    for prompt in prompts:
        engine.add_request(uuid.uuid4().hex, prompt, params)
    generated = 0
    while engine.has_unfinished:
        generated += sum(len(o.new_token_ids) for o in engine.step())
    return generated


def time_to_first_token(engine: LLMEngine, prompt: list[int], device: str) -> tuple[float, int]:
    """Seconds from adding `prompt` to its first token, and its prefix-cache hit tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    sync(device)
    started = time.perf_counter()
    engine.add_request(uuid.uuid4().hex, prompt, params)
    cached = 0
    while engine.has_unfinished:
        for output in engine.step():
            cached = output.num_cached_tokens
    sync(device)
    return time.perf_counter() - started, cached


@contextlib.contextmanager
def dense_prefix_attention() -> Iterator[None]:
    """The path before chunked prefix attention, for comparison: the whole context gathered
    from the pool into one dense copy and attended with a [Q, L] mask."""
    chunked = mla.attention_over_prefix

    def dense(
        q_nope: torch.Tensor, q_pe: torch.Tensor, own: torch.Tensor, kv: torch.Tensor,
        table: list[int], num_cached: int, block_size: int, kv_b: torch.Tensor, v_dim: int,
        scale: float,
    ) -> torch.Tensor:  # fmt: skip
        positions = torch.arange(num_cached + own.shape[0], device=kv.device)
        pages = torch.tensor(table, dtype=torch.long, device=kv.device)[positions // block_size]
        latents = kv.index_select(0, pages * block_size + positions % block_size)
        return mla.attention_expanded(
            q_nope, q_pe, latents.to(q_nope.dtype), kv_b, kv_b.shape[1], v_dim, scale
        )

    mla.attention_over_prefix = dense  # type: ignore[assignment]
    try:
        yield
    finally:
        mla.attention_over_prefix = chunked


def hf_generate(hf: Any, prompts: list[list[int]], device: str, pad_id: int) -> float:
    """Wall seconds for one HF generate() over `prompts` as one left-padded batch."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    sync(device)
    started = time.perf_counter()
    with torch.inference_mode():
        hf.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=OUTPUT_TOKENS,
            min_new_tokens=OUTPUT_TOKENS,
            do_sample=False,
            pad_token_id=pad_id,
        )
    sync(device)
    return time.perf_counter() - started


def offline(args: argparse.Namespace, checkpoint: Path, engine: LLMEngine) -> dict[str, float]:
    rng = random.Random(0)
    prompts = random_prompts(rng, NUM_REQUESTS)
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    run_engine(engine, random_prompts(rng, 4), params)  # warm-up
    sync(args.device)
    started = time.perf_counter()
    generated = run_engine(engine, prompts, params)
    sync(args.device)
    engine_s = time.perf_counter() - started
    print(
        f"(a) engine: {NUM_REQUESTS} requests, {generated} output tokens in {engine_s:.2f} s "
        f"= {generated / engine_s:.1f} tok/s"
    )
    stats = engine.stats()
    print(
        f"    MTP speculation: {stats.spec_num_tokens} draft token(s) per step, "
        f"{stats.spec_draft_steps_total} of {stats.num_steps_total} steps drafted, "
        f"{stats.spec_accepted_tokens_total}/{stats.spec_verified_tokens_total} drafts accepted "
        f"({stats.spec_acceptance_rate:.1%}), {stats.spec_mean_accepted_length:.2f} tokens per "
        f"verification, {stats.spec_draft_seconds_total:.2f} s drafting "
        "(random weights: expect almost no acceptance; see benchmarks/mtp.py)"
    )

    from transformers import DeepseekV3ForCausalLM as HFDeepseekV3
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its load report lists the MTP layer as unexpected keys
    hf_logging.disable_progress_bar()
    hf = HFDeepseekV3.from_pretrained(checkpoint, dtype=getattr(torch, args.dtype))
    hf = hf.to(args.device).eval()
    hf_generate(hf, prompts[:1], args.device, pad_id=0)  # warm-up
    single = prompts[: args.hf_single]
    single_s = sum(hf_generate(hf, [p], args.device, pad_id=0) for p in single)
    single_total = single_s / len(single) * NUM_REQUESTS
    print(
        f"    HF one at a time: {len(single)} of {NUM_REQUESTS} requests measured in "
        f"{single_s:.2f} s, extrapolated to {single_total:.1f} s "
        f"= {NUM_REQUESTS * OUTPUT_TOKENS / single_total:.1f} tok/s"
    )
    batches = [prompts[i : i + HF_BATCH] for i in range(0, NUM_REQUESTS, HF_BATCH)]
    measured = batches[: args.hf_batches]
    batch_s = sum(hf_generate(hf, b, args.device, pad_id=0) for b in measured)
    batch_total = batch_s / len(measured) * len(batches)
    print(
        f"    HF padded batches of {HF_BATCH}: {len(measured)} of {len(batches)} batches measured "
        f"in {batch_s:.2f} s, extrapolated to {batch_total:.1f} s "
        f"= {NUM_REQUESTS * OUTPUT_TOKENS / batch_total:.1f} tok/s"
    )
    del hf
    return {"vs_single": single_total / engine_s, "vs_batched": batch_total / engine_s}


def prefix_prefill(args: argparse.Namespace, engine: LLMEngine) -> float:
    """In `REPEATS` interleaved rounds: a cold prefill (a fresh prompt), a prefill sharing a
    cached 3,584-token prefix (a fresh suffix), and the same over the dense path it replaced;
    the best of each (the first round of each warms it up). On the CPU also the process's CPU
    seconds, steadier than wall time on a shared machine. Returns the cut of the best times."""
    rng = random.Random(1)
    on_cpu = args.device == "cpu"

    def fresh(n: int) -> list[int]:
        return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]

    def timed(prompt: list[int]) -> tuple[float, float, int]:
        cpu = time.process_time()
        wall, cached = time_to_first_token(engine, prompt, args.device)
        return wall, time.process_time() - cpu, cached

    prefix = fresh(CACHED_PREFIX)
    suffix = LONG_PROMPT - CACHED_PREFIX
    time_to_first_token(engine, prefix + fresh(suffix), args.device)
    cold, warm, dense = [], [], []
    for _ in range(REPEATS + 1):
        cold.append(timed(fresh(LONG_PROMPT)))
        warm.append(timed(prefix + fresh(suffix)))
        with dense_prefix_attention():
            dense.append(timed(prefix + fresh(suffix)))
    rows = {"cold": cold[1:], "cached prefix": warm[1:], "cached prefix, dense path": dense[1:]}
    best = {name: min(runs) for name, runs in rows.items()}
    cpu_best = {name: min(run[1] for run in runs) for name, runs in rows.items()}
    print(f"(c) prefill {LONG_PROMPT} tokens ({CACHED_PREFIX} cached), best of {REPEATS}:")
    for name, runs in rows.items():
        cpu = f", CPU {cpu_best[name] * 1000:.0f} ms" if on_cpu else ""
        print(
            f"    {name}: {best[name][0] * 1000:.1f} ms{cpu} ({best[name][2]} cached; all: "
            f"{', '.join(f'{run[0] * 1000:.0f}' for run in runs)} ms)"
        )
    for name in ("cached prefix", "cached prefix, dense path"):
        cpu = f", CPU time {cpu_best['cold'] / cpu_best[name]:.2f}x" if on_cpu else ""
        print(f"    cut, {name}: {best['cold'][0] / best[name][0]:.2f}x{cpu}")
    return best["cold"][0] / best["cached prefix"][0]


async def stream_once(
    session: aiohttp.ClientSession, url: str, prompt: str
) -> tuple[float, float, int]:
    """(TTFT s, time per output token s, output tokens) of one streamed chat request."""
    body = {
        "model": "deepseek-chat",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": STREAM_OUTPUT_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
    tpot = (last - first) / max(1, tokens - 1)
    return first - started, tpot, tokens


async def gateway_latency(args: argparse.Namespace, checkpoint: Path) -> None:
    # Imported here: with --parts ac the benchmark runs where only torch is installed.
    from redis.asyncio import Redis

    from gateway.config.settings import Settings
    from gateway.keys.records import KeyCreate
    from gateway.keys.store import KeyStore
    from gateway.observability.logging import configure_logging
    from testkit.gateway_app import start_gateway

    prefix = f"bench:{uuid.uuid4().hex}:"
    settings = Settings(
        server={"host": "127.0.0.1", "port": 0},
        redis={"url": args.redis_url, "key_prefix": prefix},
        logging={"format": "json", "level": "warning"},
        use_presets=False,
        engine={
            "model_path": checkpoint,
            "dtype": args.dtype,
            "max_num_seqs": max(CONCURRENCY),
            "max_batch_tokens": 4096,
            "cache_memory_mb": 256,
        },
        providers={"local": {"kind": "local"}},
        models={
            "deepseek-chat": {
                "routes": [{"provider": "local", "model": "deepseek-v3.1", "thinking": False}]
            }
        },
    )
    configure_logging(settings.logging)
    runner, root = await start_gateway(settings)
    redis = Redis.from_url(args.redis_url)
    try:
        secret, _ = await KeyStore(redis, prefix=prefix).create(KeyCreate(name="bench"))
        url = f"{root}/v1/chat/completions"
        words = "the quick brown fox jumps over the lazy dog near a river bank"
        async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {secret}"}, timeout=aiohttp.ClientTimeout(600)
        ) as session:
            await stream_once(session, url, "warm up")
            for concurrency in CONCURRENCY:
                results = await asyncio.gather(
                    *(stream_once(session, url, f"{i}: {words * 10}") for i in range(concurrency))
                )
                ttft = [r[0] * 1000 for r in results]
                tpot = [r[1] * 1000 for r in results]
                print(
                    f"(b) {concurrency:2d} streams: TTFT median {statistics.median(ttft):.1f} ms "
                    f"(max {max(ttft):.1f}), time per output token median "
                    f"{statistics.median(tpot):.2f} ms (max {max(tpot):.2f}), "
                    f"{sum(r[2] for r in results)} tokens"
                )
    finally:
        await runner.cleanup()
        keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


def verdict(name: str, value: float, target: float) -> str:
    return f"{name}: {value:.2f}x (target >= {target:g}x) {'PASS' if value >= target else 'MISS'}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=EngineConfig().resolved_device())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument("--demo-dir", type=Path, default=Path(".data/demo-checkpoint"))
    parser.add_argument("--hf-single", type=int, default=4, help="HF requests run one at a time")
    parser.add_argument("--hf-batches", type=int, default=2, help="HF padded batches run")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--parts", default="abc", help="which of (a) offline, (b) gateway, (c) prefix to run"
    )
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    print(
        f"device {args.device}, dtype {args.dtype}, torch threads {torch.get_num_threads()}; "
        "timings on a shared machine vary between runs"
    )

    checkpoint = resolve_checkpoint(None, args.demo_dir, "small")
    verdicts = []
    if "a" in args.parts or "c" in args.parts:
        config = engine_config(args.device, args.dtype)
        model = load_model(checkpoint, dtype=config.torch_dtype, device=args.device)
        engine = build_engine(model, checkpoint, config)
        if "a" in args.parts:
            ratios = offline(args, checkpoint, engine)
            verdicts.append(verdict("engine vs HF one at a time", ratios["vs_single"], 8))
            verdicts.append(verdict("engine vs HF padded batches of 8", ratios["vs_batched"], 2))
        if "c" in args.parts:
            verdicts.append(verdict("cached prefix TTFT cut", prefix_prefill(args, engine), 5))
        del engine, model
    if "b" in args.parts:
        asyncio.run(gateway_latency(args, checkpoint))
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()
