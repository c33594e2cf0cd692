"""MTP speculative decoding on a checkpoint with an MTP layer (the trained demo model), in one run.

    python -m benchmarks.mtp CHECKPOINT [--device cpu|cuda] [--dtype ...] [--batches 1,8,32]
        [--spec-tokens 1] [--output-tokens 64] [--rounds 11] [--threads 1]

For each batch size and round: as many prompts (32-token windows of the Python standard library's
source, which the demo model was trained on; new ones each round, since acceptance depends on the
text), greedy, EOS ignored, decoded three ways: plain (speculation off), speculation forced on
every step, and the engine's policy (its defaults: `spec_policy = "measured"`, which drafts at a
batch size only while its drafting steps measure faster there; the policy's engine keeps what it
learnt from round to round, as a serving engine would).
The three alternate in `--rounds` rounds in this one process (the order rotates each round), so a
slow spell of the machine hits all of them; every figure is a median over the rounds, speedups
the median of the rounds' paired ratios. Each decode phase (after every request has its first
token) is timed in wall-clock seconds and in this thread's CPU seconds (`time.thread_time`: with
one torch thread, the CPU the engine used, blind to other processes taking the cores; on a GPU
only wall clock means anything). Printed per batch size: decode tokens/s plain and with
speculation (wall), the acceptance rate, tokens per verification (accepted length), the draft's
cost (MTP seconds per drafting step / plain decode step seconds), the speedup those predict,
(1 + accepted per step) / (1 + draft cost), beside the measured one by wall clock and by CPU
time, the measured share of the predicted one, and the policy's speedup.

Targets: at batch 1 measured >= 90% of predicted and > 1; the policy never slower than plain.
"""

from __future__ import annotations

import argparse
import random
import statistics
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
MODES = ("plain", "spec", "policy")


@dataclass(frozen=True)
class Run:
    """One decode phase: tokens produced, wall and thread CPU seconds, steps, and the
    speculation counters."""

    tokens: int
    seconds: float
    cpu_seconds: float
    steps: int
    verified: int
    accepted: int
    verifications: int
    draft_steps: int
    draft_seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_seconds


@dataclass(frozen=True)
class Row:
    """One batch size's medians over the rounds."""

    plain_tps: float
    spec_tps: float
    acceptance: float
    length: float
    draft_cost: float
    predicted: float
    measured: float
    measured_cpu: float
    policy: float


def corpus_ids(tokenizer: Tokenizer) -> list[int]:
    ids: list[int] = []
    for text in stdlib_texts(400_000):
        ids.extend(tokenizer.encode(text, allow_special=False))
    return ids


def corpus_prompts(ids: list[int], count: int, seed: int) -> list[list[int]]:
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
    cuda = engine.config.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    begin, begin_cpu = time.perf_counter(), time.thread_time()
    while engine.has_unfinished:
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    if cuda:
        torch.cuda.synchronize()
    seconds, cpu_seconds = time.perf_counter() - begin, time.thread_time() - begin_cpu
    after = engine.stats()
    return Run(
        tokens=tokens,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
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


def measure(
    engines: dict[str, LLMEngine], ids: list[int], batch: int, output_tokens: int, rounds: int
) -> Row:
    """Each round: `batch` prompts of its own, decoded by each engine once, the order rotated
    every round."""
    runs: dict[str, list[Run]] = {name: [] for name in MODES}
    for name in MODES:  # warm-up, untimed
        decode(engines[name], corpus_prompts(ids, batch, seed=-batch), min(8, output_tokens))
    for r in range(rounds):
        prompts = corpus_prompts(ids, batch, seed=1000 * batch + r)
        for name in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
            runs[name].append(decode(engines[name], prompts, output_tokens))
    plain, spec, policy = runs["plain"], runs["spec"], runs["policy"]

    def ratio(a: list[Run], b: list[Run], cpu: bool = False) -> float:
        if cpu:
            return statistics.median(
                x.tokens_per_cpu_s / y.tokens_per_cpu_s for x, y in zip(a, b, strict=True)
            )
        return statistics.median(x.tokens_per_s / y.tokens_per_s for x, y in zip(a, b, strict=True))

    verified = sum(run.verified for run in spec)
    accepted = sum(run.accepted for run in spec)
    verifications = sum(run.verifications for run in spec)
    per_step = accepted / verifications if verifications else 0.0
    draft = statistics.median(run.draft_seconds / max(1, run.draft_steps) for run in spec)
    draft_cost = draft / statistics.median(run.seconds / run.steps for run in plain)
    return Row(
        plain_tps=statistics.median(run.tokens_per_s for run in plain),
        spec_tps=statistics.median(run.tokens_per_s for run in spec),
        acceptance=accepted / verified if verified else 0.0,
        length=1 + per_step,
        draft_cost=draft_cost,
        predicted=(1 + per_step) / (1 + draft_cost),
        measured=ratio(spec, plain),
        measured_cpu=ratio(spec, plain, cpu=True),
        policy=ratio(policy, plain),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--spec-tokens", type=int, default=1)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: its default)")
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
        num_threads=args.threads or None,
        spec_num_tokens=args.spec_tokens,
    )
    configs = {
        "plain": replace(base, spec_enabled=False),
        "spec": replace(base, spec_max_batch_size=None, spec_policy="fixed"),
        "policy": base,
    }
    engines = {name: build(model, args.checkpoint, configs[name]) for name in MODES}
    print(
        f"{args.checkpoint} on {args.device} ({args.dtype}, {args.threads or 'default'} "
        f"thread(s)), {args.spec_tokens} draft token(s), {args.output_tokens} output tokens per "
        f"request, policy {base.spec_policy} (cap {base.spec_max_batch_size}), medians of "
        f"{args.rounds} rounds"
    )
    print(
        f"{'batch':>5} {'plain tok/s':>11} {'spec tok/s':>10} {'accept':>6} {'len':>5} "
        f"{'draft':>6} {'predicted':>9} {'measured':>8} {'cpu':>5} {'meas/pred':>9} "
        f"{'cpu/pred':>8} {'policy':>6}"
    )
    ids = corpus_ids(tokenizer)
    for batch in batches:
        row = measure(engines, ids, batch, args.output_tokens, args.rounds)
        print(
            f"{batch:>5} {row.plain_tps:>11.1f} {row.spec_tps:>10.1f} {row.acceptance:>6.1%} "
            f"{row.length:>5.2f} {row.draft_cost:>6.2f} {row.predicted:>9.2f} "
            f"{row.measured:>8.2f} {row.measured_cpu:>5.2f} "
            f"{row.measured / row.predicted:>9.1%} {row.measured_cpu / row.predicted:>8.1%} "
            f"{row.policy:>6.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
