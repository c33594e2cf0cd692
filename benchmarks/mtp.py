"""MTP speculative decoding on a checkpoint with an MTP layer (the trained demo model), in one run.

    python -m benchmarks.mtp CHECKPOINT [--device cpu|cuda] [--dtype ...] [--batches 1,8,32]
        [--spec-tokens 1] [--output-tokens 64] [--repeats 3]

For each batch size: as many prompts (32-token windows of the Python standard library's source,
which the demo model was trained on), greedy, EOS ignored, decoded three ways in alternation,
best of `--repeats`: plain (speculation off), speculation forced on every step, and the engine's
policy (on up to `spec_max_batch_size` from the engine's defaults). Decode throughput counts the
tokens produced after every request has its first token. Printed per batch size: acceptance
rate, tokens per verification, draft cost (MTP seconds per step / plain decode step seconds),
the speedup those predict, (1 + accepted per step) / (1 + draft cost), beside the measured one,
and the policy's speedup.

Targets: at batch 1 measured >= 90% of predicted and > 1; the policy never slower than plain.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from backend.demo_train import stdlib_texts
from backend.engine.engine_config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.checkpoint import load_generation_config, load_model
from backend.model.model import DeepseekV3ForCausalLM
from backend.text.tokenizer import Tokenizer

PROMPT_TOKENS = 32


@dataclass(frozen=True)
class Run:
    """One decode phase: tokens produced, seconds, steps, and the speculation counters."""

    tokens: int
    seconds: float
    steps: int
    verified: int
    accepted: int
    verifications: int
    draft_steps: int
    draft_seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def corpus_prompts(tokenizer: Tokenizer, count: int, seed: int) -> list[list[int]]:
    ids: list[int] = []
    for text in stdlib_texts(400_000):
        ids.extend(tokenizer.encode(text, allow_special=False))
    rng = random.Random(seed)
    starts = [rng.randrange(len(ids) - PROMPT_TOKENS) for _ in range(count)]
    return [ids[s : s + PROMPT_TOKENS] for s in starts]


def decode(engine: LLMEngine, prompts: list[list[int]], output_tokens: int) -> Run:
    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}-{time.monotonic_ns()}", prompt, params)
    started: set[str] = set()
    while len(started) < len(prompts):  # prefill (and first tokens) untimed
        started.update(o.request_id for o in engine.step() if o.new_token_ids)
    before = engine.stats()
    tokens = 0
    begin = time.perf_counter()
    while engine.has_unfinished:
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    if engine.config.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - begin
    after = engine.stats()
    return Run(
        tokens=tokens,
        seconds=seconds,
        steps=after.num_steps_total - before.num_steps_total,
        verified=after.spec_verified_tokens_total - before.spec_verified_tokens_total,
        accepted=after.spec_accepted_tokens_total - before.spec_accepted_tokens_total,
        verifications=after.spec_verifications_total - before.spec_verifications_total,
        draft_steps=after.spec_draft_steps_total - before.spec_draft_steps_total,
        draft_seconds=after.spec_draft_seconds_total - before.spec_draft_seconds_total,
    )


def build(model: DeepseekV3ForCausalLM, checkpoint: Path, config: EngineConfig) -> LLMEngine:
    return LLMEngine(
        model,
        config,
        hash_seed=b"benchmark-mtp",
        generation_defaults=load_generation_config(checkpoint),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--spec-tokens", type=int, default=1)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model = load_model(args.checkpoint, dtype=getattr(torch, args.dtype), device=args.device)
    tokenizer = Tokenizer.from_dir(args.checkpoint)
    base = EngineConfig(
        max_num_seqs=max(batches),
        max_batch_tokens=max(1024, max(batches) * (1 + args.spec_tokens)),
        block_size=64,
        cache_memory_bytes=256 << 20,
        dtype=args.dtype,
        device=args.device,
        num_threads=args.threads,
        spec_num_tokens=args.spec_tokens,
    )
    modes = {
        "plain": replace(base, spec_enabled=False),
        "spec": replace(base, spec_max_batch_size=None),
        "policy": base,
    }
    engines = {name: build(model, args.checkpoint, config) for name, config in modes.items()}
    print(
        f"{args.checkpoint} on {args.device} ({args.dtype}), {args.spec_tokens} draft token(s), "
        f"{args.output_tokens} output tokens per request, policy threshold "
        f"{base.spec_max_batch_size}, best of {args.repeats}"
    )
    header = (
        f"{'batch':>5} {'plain tok/s':>11} {'spec tok/s':>10} {'accept':>6} {'len':>5} "
        f"{'draft':>6} {'predicted':>9} {'measured':>8} {'meas/pred':>9} {'policy':>6}"
    )
    print(header)
    for batch in batches:
        prompts = corpus_prompts(tokenizer, batch, seed=batch)
        best: dict[str, Run] = {}
        for _ in range(args.repeats):
            for name, engine in engines.items():
                run = decode(engine, prompts, args.output_tokens)
                if name not in best or run.seconds < best[name].seconds:
                    best[name] = run
        plain, spec, policy = best["plain"], best["spec"], best["policy"]
        acceptance = spec.accepted / spec.verified if spec.verified else 0.0
        per_step = spec.accepted / spec.verifications if spec.verifications else 0.0
        draft_cost = (spec.draft_seconds / max(1, spec.draft_steps)) / (plain.seconds / plain.steps)
        predicted = (1 + per_step) / (1 + draft_cost)
        measured = spec.tokens_per_s / plain.tokens_per_s
        print(
            f"{batch:>5} {plain.tokens_per_s:>11.1f} {spec.tokens_per_s:>10.1f} "
            f"{acceptance:>6.1%} {1 + per_step:>5.2f} {draft_cost:>6.2f} {predicted:>9.2f} "
            f"{measured:>8.2f} {measured / predicted:>9.1%} "
            f"{policy.tokens_per_s / plain.tokens_per_s:>6.2f}"
        )


if __name__ == "__main__":
    main()
