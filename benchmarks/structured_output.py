"""Structured output: the grammar's cost per decoded token, and compile times, in one run.

    python -m benchmarks.structured_output [--device cpu|cuda] [--steps 24] [--repeats 3]
        [--batches 1,32] [--modes greedy,sampled] [--parts ab]

(a) Decode steps of the "small" demo preset (random weights, MTP drafting off) at batch 1 and
    32, greedy and sampled (temperature 1): every sequence constrained by a JSON Schema (an array
    of 200 small objects, so no answer ends while it is timed) against the same batch
    unconstrained (EOS ignored). Prefill is left out: the timed steps are decode steps only.
    Printed: ms per step both ways and their ratio; the grammar's own time (matchers filling
    their bitmasks and the masks applied); and the step's time outside the model's forward both
    ways, whose difference over the unconstrained step is the ratio with the forward's noise
    taken out (on a shared, loaded CPU the forward alone varies far more than the mask costs).
    Target: <= 1.05x at batch 32 on the CPU.
(b) Compile time of a typical schema (an object of strings, numbers, an enum, a nested object
    and an array): cold (a new compiler, nothing cached) and cached; and the one-off vocabulary
    set-up a compiler needs at start.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from backend.engine.engine_config import EngineConfig
from backend.engine.grammar import GrammarCompiler, GrammarMasks
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.checkpoint import load_generation_config, load_model
from backend.text.structured import build_constraint
from backend.text.tokenizer import Tokenizer
from providers.local.setup import resolve_checkpoint

PROMPT_TOKENS = 64
TOKEN_RANGE = (1000, 120_000)
LONG_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"k": {"enum": ["a", "b"]}, "v": {"type": "integer", "minimum": 0}},
        "required": ["k", "v"],
        "additionalProperties": False,
    },
    "minItems": 200,
    "maxItems": 200,
}
TYPICAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "rating": {"type": "number"},
        "genre": {"enum": ["drama", "comedy", "thriller", "documentary"]},
        "director": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
            "required": ["name", "born"],
            "additionalProperties": False,
        },
        "cast": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
    },
    "required": ["title", "year", "rating", "genre", "director", "cast"],
    "additionalProperties": False,
}


def strict_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "b", "schema": schema, "strict": True}}


class TimedMasks(GrammarMasks):
    """GrammarMasks that add up the seconds spent in `apply`."""

    seconds = 0.0

    def apply(self, logits: torch.Tensor, rows: Any) -> None:
        started = time.perf_counter()
        super().apply(logits, rows)
        self.seconds += time.perf_counter() - started


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class TimedForward:
    """Wraps a model's `forward_with_logits`, adding up its seconds."""

    def __init__(self, model: Any) -> None:
        self.inner = model.forward_with_logits
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = self.inner(*args, **kwargs)
        self.seconds += time.perf_counter() - started
        return out


def decode_ms(
    engine: LLMEngine,
    compiled: object | None,
    params: SamplingParams,
    batch: int,
    steps: int,
    device: str,
) -> tuple[float, float, float]:
    """ms per decode step of `batch` sequences; of it, ms in the grammar's masks and ms outside
    the model's forward."""
    rng = random.Random(batch)
    masks = TimedMasks()
    engine.runner.grammar = masks
    forward = TimedForward(engine.runner.model)
    engine.runner.model.forward_with_logits = forward  # type: ignore[method-assign]
    ids = []
    for _ in range(batch):
        request_id = uuid.uuid4().hex
        prompt = [rng.randrange(*TOKEN_RANGE) for _ in range(PROMPT_TOKENS)]
        engine.add_request(request_id, prompt, params, compiled)
        ids.append(request_id)
    produced: dict[str, int] = dict.fromkeys(ids, 0)
    while min(produced.values()) == 0:  # prefill (and the first token) untimed
        for output in engine.step():
            produced[output.request_id] += len(output.new_token_ids)
    masks.seconds = forward.seconds = 0.0
    sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        for output in engine.step():
            assert not output.finished, "an answer ended while timed"
    sync(device)
    elapsed = time.perf_counter() - started
    for request_id in ids:
        engine.abort(request_id)
    del engine.runner.model.forward_with_logits  # the class's method again
    outside = elapsed - forward.seconds
    return 1000 * elapsed / steps, 1000 * masks.seconds / steps, 1000 * outside / steps


def part_a(args: argparse.Namespace, checkpoint: Path, grammars: GrammarCompiler) -> list[str]:
    config = EngineConfig(
        max_num_seqs=32,
        max_batch_tokens=4096,
        block_size=64,
        cache_memory_bytes=256 << 20,
        device=args.device,
        spec_enabled=False,
    )
    model = load_model(checkpoint, dtype=config.torch_dtype, device=args.device)
    engine = LLMEngine(
        model, config, hash_seed=b"bench", generation_defaults=load_generation_config(checkpoint)
    )
    constraint = build_constraint(strict_format(LONG_SCHEMA), [], None, None)
    assert constraint is not None
    compiled = grammars.compile(constraint.text)
    verdicts = []
    print("(a) decode step, constrained vs unconstrained (median of repeats)")
    modes = {"greedy": 0.0, "sampled": 1.0}
    for label in args.modes.split(","):
        temperature = modes[label]
        for batch in (int(b) for b in args.batches.split(",")):
            free = SamplingParams(temperature=temperature, top_p=1.0, ignore_eos=True)
            bound = SamplingParams(temperature=temperature, top_p=1.0, grammar=constraint.text)
            plain_ms, masked_ms, mask_ms, plain_out, masked_out = [], [], [], [], []
            for _ in range(args.repeats):  # interleaved, so load drifts hit both alike
                step, _, out = decode_ms(engine, None, free, batch, args.steps, args.device)
                plain_ms.append(step)
                plain_out.append(out)
                step, mask, out = decode_ms(engine, compiled, bound, batch, args.steps, args.device)
                masked_ms.append(step)
                mask_ms.append(mask)
                masked_out.append(out)
            plain, masked = statistics.median(plain_ms), statistics.median(masked_ms)
            mask = statistics.median(mask_ms)
            ratio = masked / plain
            extra = statistics.median(masked_out) - statistics.median(plain_out)
            steady = 1 + extra / plain
            print(
                f"  {label:7s} batch {batch:2d}: unconstrained {plain:7.2f} ms/step, "
                f"constrained {masked:7.2f} ms/step, ratio {ratio:.3f}x; "
                f"masks {mask:.2f} ms/step = {100 * mask / plain:.1f}% of the free step; "
                f"outside the forward {statistics.median(plain_out):.2f} vs "
                f"{statistics.median(masked_out):.2f} ms/step: {steady:.3f}x"
            )
            if batch == 32:
                ok = steady <= 1.05
                verdicts.append(
                    f"{label} batch 32, forward noise out: {steady:.3f}x (target <= 1.05x) "
                    f"{'PASS' if ok else 'MISS'}; raw {ratio:.3f}x"
                )
    return verdicts


def part_b(checkpoint: Path, vocab_size: int) -> None:
    tokenizer = Tokenizer.from_dir(checkpoint)
    started = time.perf_counter()
    grammars = GrammarCompiler(tokenizer, vocab_size)
    setup = time.perf_counter() - started
    constraint = build_constraint(strict_format(TYPICAL_SCHEMA), [], None, None)
    assert constraint is not None
    started = time.perf_counter()
    grammars.compile(constraint.text)
    cold = time.perf_counter() - started
    cached = []
    for _ in range(1000):
        started = time.perf_counter()
        grammars.compile(constraint.text)
        cached.append(time.perf_counter() - started)
    warm = statistics.median(cached)
    print("(b) compile of a typical schema")
    print(f"  vocabulary set-up (once per engine): {1000 * setup:.0f} ms")
    print(f"  cold: {1000 * cold:.1f} ms; cached: {1e6 * warm:.1f} us ({cold / warm:.0f}x faster)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=EngineConfig().resolved_device())
    parser.add_argument("--demo-dir", type=Path, default=Path(".data/demo-checkpoint"))
    parser.add_argument("--steps", type=int, default=24, help="timed decode steps per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="ab")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--modes", default="greedy,sampled", help="greedy, sampled or both")
    args = parser.parse_args(argv)
    checkpoint = resolve_checkpoint(None, args.demo_dir, "small")
    vocab_size = int(json.loads((checkpoint / "config.json").read_text())["vocab_size"])
    verdicts: list[str] = []
    if "b" in args.parts:
        part_b(checkpoint, vocab_size)
    if "a" in args.parts:
        grammars = GrammarCompiler(Tokenizer.from_dir(checkpoint), vocab_size)
        verdicts += part_a(args, checkpoint, grammars)
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    main()
