"""The parallel engine on this machine: decode step time and tokens/s at 1, 2 and 4 ranks, the
bytes rank 0 sends per decode step against the analytic count from the model's shapes, and the
share of a step rank 0 spends inside collectives.

    python -m benchmarks.parallel [--preset small|tiny] [--ranks 1,2,4] [--batch 4]
                                  [--steps 16] [--expert-parallel]

Each run loads the demo checkpoint of the preset (built under .data/demo-checkpoint when
missing) into an engine with ``tensor_parallel`` ranks, one torch thread per rank, prefills
``--batch`` prompts of 64 random tokens, then times ``--steps`` greedy decode steps (no drafts).
Rank 0 counts what it puts into collectives (``RankGroup.bytes_sent``) and the seconds it spends
in them, waiting for slower ranks included. On CPU the ranks share the machine's cores: more
ranks than cores measure the protocol's overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from backend.engine.engine_config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.checkpoint import load_generation_config, load_model
from backend.model.config import ModelConfig
from backend.model.model import DeepseekV3ForCausalLM
from backend.parallel.cluster import start_parallel_model
from backend.parallel.model import ShardedCausalLM
from backend.parallel.sizing import decode_step_bytes
from providers.local.setup import resolve_checkpoint

PROMPT_TOKENS = 64
BLOCK_SIZE = 64


def engine_config(ranks: int, batch: int, expert_parallel: bool) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=batch,
        max_batch_tokens=batch * PROMPT_TOKENS,
        block_size=BLOCK_SIZE,
        cache_memory_bytes=64 << 20,
        dtype="float32",
        device="cpu",
        num_threads=1,
        spec_enabled=False,
        tensor_parallel=ranks,
        expert_parallel=expert_parallel,
        parallel_timeout_s=120.0,
    )


def run(checkpoint: Path, ranks: int, batch: int, steps: int, expert_parallel: bool) -> dict:
    config = engine_config(ranks, batch, expert_parallel)
    torch.set_num_threads(1)
    model: DeepseekV3ForCausalLM
    if ranks == 1:
        model = load_model(checkpoint, dtype=torch.float32)
    else:
        model, _ = start_parallel_model(checkpoint, config)
    try:
        engine = LLMEngine(
            model,
            config,
            hash_seed=b"benchmark",
            generation_defaults=load_generation_config(checkpoint),
        )
        rng = random.Random(0)
        params = SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True)
        for i in range(batch):
            prompt = [rng.randrange(1000, 100_000) for _ in range(PROMPT_TOKENS)]
            engine.add_request(f"r{i}", prompt, params)
        engine.step()  # every prefill, with the first tokens
        engine.step()  # one decode step to warm up
        group = model.group if isinstance(model, ShardedCausalLM) else None
        sent0 = group.bytes_sent if group else 0
        comm0 = group.seconds if group else 0.0
        started = time.perf_counter()
        for _ in range(steps):
            engine.step()
        elapsed = time.perf_counter() - started
        while engine.has_unfinished:
            engine.step()
        step_s = elapsed / steps
        analytic = decode_step_bytes(
            model.config, ranks, expert_parallel=expert_parallel, num_seqs=batch,
            dtype=torch.float32, context_len=PROMPT_TOKENS + 2 + steps // 2,
            block_size=BLOCK_SIZE,
        )  # fmt: skip
        worker = decode_step_bytes(
            model.config, ranks, expert_parallel=expert_parallel, num_seqs=batch,
            dtype=torch.float32, rank=1,
        )  # fmt: skip
        return {
            "ranks": ranks,
            "step_ms": step_s * 1e3,
            "tokens_s": batch / step_s,
            "sent": (group.bytes_sent - sent0) / steps if group else 0.0,
            "analytic": analytic.total,
            "worker_analytic": worker.total,
            "comm_share": ((group.seconds - comm0) / elapsed) if group else 0.0,
        }
    finally:
        model.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=["tiny", "small"], default="small")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--expert-parallel", action="store_true")
    args = parser.parse_args()
    checkpoint = resolve_checkpoint(None, Path(".data/demo-checkpoint"), args.preset)
    config = ModelConfig.from_file(checkpoint)
    print(
        f"preset {args.preset}: hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
        f"{config.moe.n_routed_experts} experts, batch {args.batch}, fp32, 1 thread per rank, "
        f"expert_parallel={args.expert_parallel}"
    )
    header = (
        f"{'ranks':>5} {'step ms':>9} {'tokens/s':>9} {'rank 0 sent B/step':>19} "
        f"{'analytic':>10} {'worker analytic':>16} {'comm share':>11}"
    )
    print(header)
    for ranks in (int(r) for r in args.ranks.split(",")):
        row = run(checkpoint, ranks, args.batch, args.steps, args.expert_parallel)
        print(
            f"{row['ranks']:>5} {row['step_ms']:>9.2f} {row['tokens_s']:>9.1f} "
            f"{row['sent']:>19,.0f} {row['analytic']:>10,} {row['worker_analytic']:>16,} "
            f"{row['comm_share']:>10.0%}"
        )


if __name__ == "__main__":
    main()
