"""Stream a greedy completion of one chat prompt: a smoke test of checkpoint, model, tokenizer.

``python -m backend.generate --model DIR --prompt TEXT [--thinking] [--max-tokens N]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.checkpoint import load_model
from backend.model.dtypes import torch_dtype
from backend.model.model import DeepseekV3ForCausalLM
from backend.text.detokenizer import IncrementalDetokenizer
from backend.text.tokenizer import Tokenizer

# One sequence over a fresh contiguous cache, without the engine: the CLI below, tests and
# benchmarks use these.


def new_cache(
    model: DeepseekV3ForCausalLM,
    num_tokens: int,
    block_size: int = 16,
    dtype: torch.dtype | None = None,
) -> PagedLatentCache:
    """A latent cache for `num_tokens` positions over every cache layer of `model`."""
    return PagedLatentCache(
        num_layers=model.num_cache_layers,
        num_blocks=-(-num_tokens // block_size),
        block_size=block_size,
        latent_dim=model.config.latent_dim,
        dtype=dtype or model.dtype,
        device=model.device,
    )


def logits_for(model: DeepseekV3ForCausalLM, token_ids: list[int]) -> Tensor:
    """[T, vocab] fp32 logits of every position of ``token_ids``, prefilled in one step."""
    cache = new_cache(model, len(token_ids))
    batch = ForwardBatch.for_prefill(
        token_ids, 0, list(range(cache.num_blocks)), cache.block_size, model.device
    )
    return model.compute_logits(model(batch, cache))


def iter_greedy(
    model: DeepseekV3ForCausalLM, prompt_ids: list[int], max_new_tokens: int, block_size: int = 16
) -> Iterator[int]:
    """Prefill the prompt, then decode greedily one token per step (absorbed attention)."""
    cache = new_cache(model, len(prompt_ids) + max_new_tokens, block_size)
    table = list(range(cache.num_blocks))
    batch = ForwardBatch.for_prefill(prompt_ids, 0, table, block_size, model.device)
    hidden = model(batch, cache)
    for step in range(max_new_tokens):
        next_id = int(model.compute_logits(hidden[-1:]).argmax(dim=-1))
        yield next_id
        if step + 1 == max_new_tokens:
            return
        position = len(prompt_ids) + step
        batch = ForwardBatch.for_prefill([next_id], position, table, block_size, model.device)
        hidden = model(batch, cache)


def generate_greedy(
    model: DeepseekV3ForCausalLM, prompt_ids: list[int], max_new_tokens: int, block_size: int = 16
) -> list[int]:
    """``max_new_tokens`` greedy tokens after ``prompt_ids`` (no stop token)."""
    return list(iter_greedy(model, prompt_ids, max_new_tokens, block_size))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="checkpoint directory")
    parser.add_argument("--prompt", required=True, help="the user message")
    parser.add_argument("--thinking", action="store_true", help="open the reply with <think>")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)

    tokenizer = Tokenizer.from_dir(args.model)
    model = load_model(args.model, dtype=torch_dtype(args.dtype), load_mtp=False)
    messages = [{"role": "user", "content": args.prompt}]
    prompt_ids = tokenizer.encode_chat(messages, thinking=args.thinking)
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    if args.thinking:
        sys.stdout.write("<think>")
    started = time.perf_counter()
    count = 0
    for token_id in iter_greedy(model, prompt_ids, args.max_tokens):
        count += 1
        if token_id == tokenizer.special.eos:
            break
        sys.stdout.write(detokenizer.push(token_id))
        sys.stdout.flush()
    sys.stdout.write(detokenizer.flush() + "\n")
    sys.stdout.flush()
    elapsed = time.perf_counter() - started
    print(
        f"[{len(prompt_ids)} prompt tokens, {count} generated in {elapsed:.2f} s]", file=sys.stderr
    )


if __name__ == "__main__":
    main()
