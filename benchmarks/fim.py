"""Fill in the middle on the local engine: latency for an editor's file head, the prefix cache's
effect, and MTP acceptance on code.

    python -m benchmarks.fim [CHECKPOINT] [--demo-dir .data/demo-checkpoint] [--head-tokens 2000]
        [--output-tokens 16] [--repeats 5] [--acceptance-prompts 8] [--threads 1]

Without CHECKPOINT it serves the trained demo (built under `--demo-dir` when missing, as the
gateway's first start does). Through `LocalProvider` (the gateway's local provider: FIM prompt,
engine, detokenizer), greedy, one request at a time, the engine's default settings:

1. Latency: a FIM request whose prefix is the first `--head-tokens` tokens of a standard-library
   module and whose suffix is the module's next 16 tokens, `--output-tokens` tokens out. The first
   request computes the whole prompt; the `--repeats` repeats find its blocks in the prefix
   cache (an editor sends the same head again and again). Printed: time to the first token and
   to the last, first and median of the repeats, and the cached prompt tokens.
2. Acceptance: `--acceptance-prompts` FIM requests on function heads of other modules (the body's
   first line as prefix, the next function as suffix), 48 tokens each; printed: the MTP drafts
   accepted / verified, and tokens per verification, from the engine's counters.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from pathlib import Path

import torch

from backend.demo_train import stdlib_texts
from backend.engine.engine_config import EngineConfig
from backend.text.tokenizer import Tokenizer
from providers.local.provider import LocalProvider
from providers.local.setup import load_local_provider
from providers.types import ChatRequest, Sampling, TextDelta, Usage

_DEF = re.compile(r"^def \w+\(.*\):\n(?:    .*\n)", re.MULTILINE)


async def _complete(
    local: LocalProvider, prefix: str, suffix: str, max_tokens: int
) -> tuple[float, float, Usage, str]:
    """(seconds to the first text, seconds to the end, usage, the middle) of one greedy FIM
    request."""
    request = ChatRequest(
        model="deepseek-v3.1",
        messages=(),
        sampling=Sampling(max_tokens=max_tokens, temperature=0.0),
        prompt=prefix,
        suffix=suffix,
    )
    started = time.perf_counter()
    first: float | None = None
    usage = Usage()
    text: list[str] = []
    async for event in local.chat(request):
        if isinstance(event, TextDelta):
            if first is None:
                first = time.perf_counter() - started
            text.append(event.text)
        elif isinstance(event, Usage):
            usage = event
    total = time.perf_counter() - started
    return first if first is not None else total, total, usage, "".join(text)


def _file_head(tokenizer: Tokenizer, head_tokens: int) -> tuple[str, str]:
    """The first module with more than `head_tokens` tokens: (its head, the next 16 tokens: the
    tiny demo's 2,048-token context leaves no room for a longer suffix)."""
    for text in stdlib_texts(50_000_000):
        ids = tokenizer.encode(text, allow_special=False)
        if len(ids) > head_tokens + 200:
            return tokenizer.decode(ids[:head_tokens]), tokenizer.decode(
                ids[head_tokens : head_tokens + 16]
            )
    raise RuntimeError(f"no standard-library module has {head_tokens} tokens")


def _function_heads(count: int) -> list[tuple[str, str]]:
    """(module text up to a function's first body line, the module's next function onwards)."""
    cases: list[tuple[str, str]] = []
    for text in stdlib_texts(50_000_000):
        matches = list(_DEF.finditer(text))
        if len(matches) < 3:
            continue
        head, after = matches[len(matches) // 2], matches[len(matches) // 2 + 1]
        prefix = text[max(0, head.end() - 1200) : head.end()]
        cases.append((prefix, text[after.start() : after.start() + 400]))
        if len(cases) == count:
            break
    return cases


async def run(args: argparse.Namespace) -> None:
    config = EngineConfig(device="cpu", num_threads=args.threads)
    async with load_local_provider(
        "local",
        config,
        model_path=args.checkpoint,
        demo_dir=args.demo_dir,
        demo_preset="tiny",
        demo_trained=True,
    ) as local:
        assert local.checkpoint is not None
        tokenizer = Tokenizer.from_dir(local.checkpoint)
        head, suffix = _file_head(tokenizer, args.head_tokens)
        first_ttft, first_total, first_usage, _ = await _complete(
            local, head, suffix, args.output_tokens
        )
        repeats = [
            await _complete(local, head, suffix, args.output_tokens) for _ in range(args.repeats)
        ]
        cached = repeats[-1][2].cached_prompt_tokens
        print(
            f"FIM on a {first_usage.prompt_tokens}-token prompt ({args.head_tokens}-token file "
            f"head), {args.output_tokens} tokens out, {torch.get_num_threads()} torch thread(s)"
        )
        print(
            f"  first request:   first token {first_ttft * 1000:7.0f} ms, "
            f"whole answer {first_total * 1000:7.0f} ms, cached prompt tokens "
            f"{first_usage.cached_prompt_tokens}"
        )
        print(
            f"  repeats (median of {args.repeats}): first token "
            f"{statistics.median(r[0] for r in repeats) * 1000:7.0f} ms, whole answer "
            f"{statistics.median(r[1] for r in repeats) * 1000:7.0f} ms, cached prompt tokens "
            f"{cached}"
        )
        before = local.engine_stats()
        produced = 0
        sample = ""
        for prefix, after in _function_heads(args.acceptance_prompts):
            _, _, usage, middle = await _complete(local, prefix, after, 48)
            produced += usage.completion_tokens
            sample = sample or middle
        after_stats = local.engine_stats()
        verified = after_stats.spec_verified_tokens_total - before.spec_verified_tokens_total
        accepted = after_stats.spec_accepted_tokens_total - before.spec_accepted_tokens_total
        checks = after_stats.spec_verifications_total - before.spec_verifications_total
        print(
            f"MTP on code ({args.acceptance_prompts} FIM requests, {produced} tokens): "
            f"{accepted}/{verified} drafts accepted"
            + (
                f" ({accepted / verified:.0%}), {1 + accepted / checks:.2f} tokens per verification"
                if verified and checks
                else " (no drafts: the checkpoint has no MTP layer or speculation is off)"
            )
        )
        print(f"  sample middle: {sample[:160]!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, nargs="?", default=None)
    parser.add_argument("--demo-dir", type=Path, default=Path(".data/demo-checkpoint"))
    parser.add_argument("--head-tokens", type=int, default=2000)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--acceptance-prompts", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
