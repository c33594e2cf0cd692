"""The parallel engine on this machine, tensor- against data-parallel attention: decode step time
and tokens/s at 1, 2 and 4 ranks; each rank's bytes per decode step against the analytic count
from the model's shapes (what it puts into collectives, ``backend.parallel.sizing``
``decode_step_bytes``; the cached latents its attention reads, ``attention_read_bytes``); the
share of a step rank 0 spends inside collectives; each rank's attention time and time inside
collectives per step; and what uneven shares cost.

    python -m benchmarks.parallel [--preset small|tiny] [--ranks 1,2,4] [--batch 4]
                                  [--steps 16] [--prompt-tokens 64] [--expert-parallel]
                                  [--modes tp,dp,dp-uneven]

Each run loads the demo checkpoint of the preset (built under .data/demo-checkpoint when
missing) into an engine with ``tensor_parallel`` ranks, one torch thread per rank, prefills
``--batch`` prompts of ``--prompt-tokens`` random tokens (64), then times ``--steps`` greedy
decode steps (no drafts).
Every rank counts the payload bytes it puts into collectives and the latent bytes its
attention layers read (one row per context token and decoder layer, from the batches each
rank's attention ran); rank 0 collects them after the run. The "all-reduce" column is the
analytic count of the same step with every attention's rows joined by all-reduce (as
data-parallel attention joined them before its all-gather; under tensor parallel the count
itself). Layouts: ``tp`` (heads split, every
rank attends to every sequence), ``dp`` (data-parallel attention, the sequences spread over
the ranks by the placement) and ``dp-uneven`` (all but the prompts' last 16 tokens shared and
cached on rank 0 by a request before: every sequence placed there, the other ranks attend to
nothing and wait in the step's collectives). On CPU the ranks share the machine's cores: more
ranks than cores measure the protocol's overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import torch

from backend.engine.engine_config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.checkpoint import load_generation_config, load_model
from backend.model.config import ModelConfig
from backend.model.model import DeepseekV3ForCausalLM
from backend.parallel.cluster import start_parallel_model
from backend.parallel.layout import Layout
from backend.parallel.model import ShardedCausalLM
from backend.parallel.sizing import attention_read_bytes, decode_step_bytes
from providers.local.setup import resolve_checkpoint

BLOCK_SIZE = 16


def engine_config(
    ranks: int, batch: int, prompt_tokens: int, expert_parallel: bool, dp: bool
) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=batch,
        max_batch_tokens=batch * prompt_tokens,
        block_size=BLOCK_SIZE,
        cache_memory_bytes=64 << 20,
        dtype="float32",
        device="cpu",
        num_threads=1,
        spec_enabled=False,
        tensor_parallel=ranks,
        expert_parallel=expert_parallel,
        data_parallel_attention=dp,
        parallel_timeout_s=120.0,
    )


def prompts(batch: int, length: int, shared: bool) -> list[list[int]]:
    """``batch`` random prompts; ``shared``: all but their last block the same."""
    rng = random.Random(0)
    head = [rng.randrange(1000, 100_000) for _ in range(length - BLOCK_SIZE)]
    out = []
    for _ in range(batch):
        own = [rng.randrange(1000, 100_000) for _ in range(length)]
        out.append(head + own[len(head) :] if shared else own)
    return out


def run(
    checkpoint: Path, ranks: int, batch: int, prompt_tokens: int, steps: int,
    expert_parallel: bool, mode: str,
) -> dict[str, Any]:  # fmt: skip
    dp = mode.startswith("dp")
    config = engine_config(ranks, batch, prompt_tokens, expert_parallel, dp)
    torch.set_num_threads(1)
    model: DeepseekV3ForCausalLM
    if ranks == 1:
        model = load_model(checkpoint, dtype=torch.float32)
    else:
        model, _ = start_parallel_model(checkpoint, config)
    try:
        engine = LLMEngine(
            model, config, hash_seed=b"benchmark",
            generation_defaults=load_generation_config(checkpoint),
        )  # fmt: skip
        params = SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True)
        batch_prompts = prompts(batch, prompt_tokens, shared=mode == "dp-uneven")
        if mode == "dp-uneven":  # the shared head cached on rank 0 first
            engine.add_request("warm", batch_prompts[0], replace_max(params, 1))
            while engine.has_unfinished:
                engine.step()
        for i, prompt in enumerate(batch_prompts):
            engine.add_request(f"r{i}", prompt, params)
        engine.step()  # every prefill, with the first tokens
        engine.step()  # one decode step to warm up
        sharded = model if isinstance(model, ShardedCausalLM) else None
        before = sharded.rank_counters() if sharded else []
        started = time.perf_counter()
        for _ in range(steps):
            engine.step()
        elapsed = time.perf_counter() - started
        after = sharded.rank_counters() if sharded else []
        while engine.has_unfinished:
            engine.step()
        return {
            "mode": mode,
            "ranks": ranks,
            "step_ms": elapsed / steps * 1e3,
            "tokens_s": batch * steps / elapsed,
            "comm_share": (after[0].collective_seconds - before[0].collective_seconds) / elapsed
            if sharded
            else 0.0,
            "per_rank": [
                _rank_row(
                    model.config, ranks, batch, prompt_tokens, steps, expert_parallel, mode, b, a
                )  # fmt: skip
                for b, a in zip(before, after, strict=True)
            ],
        }
    finally:
        model.close()


def replace_max(params: SamplingParams, max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=params.temperature, max_tokens=max_tokens, ignore_eos=True)


def _rank_row(
    config: ModelConfig, ranks: int, batch: int, prompt_tokens: int, steps: int,
    expert_parallel: bool, mode: str, before: Any, after: Any,
) -> dict[str, float]:  # fmt: skip
    """One rank's measured bytes per step and the analytic counts (the latents' at the mean
    context of the timed steps: the prompt, the first token, the warm-up step's, then one
    more a step; under ``dp`` the busiest rank's ceil(S / N) sequences, as the placement
    balances them; under ``dp-uneven`` every sequence on rank 0)."""
    context = prompt_tokens + 2 + (steps - 1) / 2
    dp = mode.startswith("dp")
    busiest = batch if mode == "dp-uneven" else -(-batch // ranks)  # sequences on one rank
    sent = decode_step_bytes(
        config, ranks, expert_parallel=expert_parallel, num_seqs=batch, dtype=torch.float32,
        rank=before.rank, context_len=round(context), block_size=BLOCK_SIZE,
        attention_seqs=busiest if dp else None,
    )  # fmt: skip
    reduced = decode_step_bytes(  # the same step with every join an all-reduce
        config, ranks, expert_parallel=expert_parallel, num_seqs=batch, dtype=torch.float32,
        rank=before.rank, context_len=round(context), block_size=BLOCK_SIZE,
    )  # fmt: skip
    layout = Layout(before.rank, ranks, expert_parallel, data_parallel_attention=dp)
    if mode == "dp-uneven":  # rank 0 attends to every sequence, as a tensor parallel rank does
        layout = Layout(before.rank, ranks, expert_parallel)
    per_token = attention_read_bytes(
        config, layout, num_seqs=batch if before.rank == 0 or mode != "dp-uneven" else 0,
        context_len=1, dtype=torch.float32,
    ).latents  # fmt: skip
    return {
        "rank": before.rank,
        "attn_ms": (after.attention_seconds - before.attention_seconds) / steps * 1e3,
        "wait_ms": (after.collective_seconds - before.collective_seconds) / steps * 1e3,
        "sent": (after.bytes_sent - before.bytes_sent) / steps,
        "sent_analytic": sent.total,
        "sent_all_reduce": reduced.total,
        "latents": (after.latent_bytes_read - before.latent_bytes_read) / steps,
        "latents_analytic": per_token * context,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=["tiny", "small"], default="small")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--expert-parallel", action="store_true")
    parser.add_argument("--modes", default="tp,dp,dp-uneven")
    args = parser.parse_args()
    checkpoint = resolve_checkpoint(None, Path(".data/demo-checkpoint"), args.preset)
    config = ModelConfig.from_file(checkpoint)
    print(
        f"preset {args.preset}: hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
        f"{config.moe.n_routed_experts} experts, batch {args.batch}, prompts of "
        f"{args.prompt_tokens} tokens, fp32, 1 thread per rank, "
        f"expert_parallel={args.expert_parallel}; bytes per decode step, measured / analytic"
    )
    print(
        f"{'layout':>9} {'ranks':>5} {'step ms':>8} {'tokens/s':>9} {'comm':>5}  "
        f"{'rank':>4} {'attn ms':>7} {'coll ms':>7} {'collectives B':>14} {'analytic':>10} "
        f"{'ratio':>6} {'all-reduce':>10} {'latents read B':>15} {'analytic':>10} {'ratio':>6}"
    )
    for ranks in (int(r) for r in args.ranks.split(",")):
        modes = ["tp"] if ranks == 1 else args.modes.split(",")
        for mode in modes:
            row = run(
                checkpoint, ranks, args.batch, args.prompt_tokens, args.steps,
                args.expert_parallel, mode,
            )  # fmt: skip
            head = (
                f"{row['mode'] if ranks > 1 else 'one':>9} {ranks:>5} {row['step_ms']:>8.2f} "
                f"{row['tokens_s']:>9.1f} {row['comm_share']:>5.0%}"
            )
            print(head)
            for each in row["per_rank"]:
                print(
                    f"{'':>41}{each['rank']:>4} {each['attn_ms']:>7.2f} {each['wait_ms']:>7.2f} "
                    f"{each['sent']:>14,.0f} "
                    f"{each['sent_analytic']:>10,} {_ratio(each['sent'], each['sent_analytic'])} "
                    f"{each['sent_all_reduce']:>10,} "
                    f"{each['latents']:>15,.0f} {each['latents_analytic']:>10,.0f} "
                    f"{_ratio(each['latents'], each['latents_analytic'])}"
                )


def _ratio(measured: float, analytic: float) -> str:
    return f"{measured / analytic:>6.2f}" if analytic else f"{'-':>6}"


if __name__ == "__main__":
    main()
