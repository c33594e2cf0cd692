"""Stream a greedy completion of one chat prompt: a smoke test of checkpoint, model, tokenizer.

``python -m backend.generate --model DIR --prompt TEXT [--thinking] [--max-tokens N]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from backend.model.checkpoint import load_model
from backend.model.dtypes import torch_dtype
from backend.text.detokenizer import IncrementalDetokenizer
from backend.text.tokenizer import Tokenizer


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
    for token_id in model.iter_greedy(prompt_ids, args.max_tokens):
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
