"""Decode speed of the CPU engine with each build of the native kernels, side by side in one run:
the torch path (no kernels: a slim image without a compiler or a portable build); the portable
builds the Docker image's build stage makes (x86-64-v3 and v4; a CPU loads the best it runs),
and x86-64-v2, the baseline the image does not ship; and the build for this CPU (`-march=native`,
what a host with a compiler makes at run time).

    .venv/bin/python benchmarks/native_builds.py [--preset small] [--tokens 32] [--runs 3]

Each variant runs in a process of its own, greedy decoding of one sequence over the random-weight
demo checkpoint (fp32, one torch thread); printed: decode tokens/s (the best of `--runs`) and the
ratio to the torch path. Only the levels this CPU can run are measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(checkpoint: Path, tokens: int, runs: int, lib_path: str) -> dict[str, object]:
    """`lib_path`: the kernels to use ("" for none: the torch path)."""
    import torch

    from backend.generate import iter_greedy
    from backend.model import checkpoint as checkpoint_module
    from backend.model.checkpoint import load_model
    from backend.native import build, ops

    lib = build.load_library(Path(lib_path)) if lib_path else None
    ops.library = checkpoint_module.library = lambda: lib  # type: ignore[assignment]
    torch.set_num_threads(1)
    model = load_model(checkpoint, dtype=torch.float32, load_mtp=False, progress=False)
    prompt = list(range(100, 132))
    best = 0.0
    with torch.inference_mode():
        for _ in range(runs):
            steps = iter_greedy(model, prompt, tokens + 1)
            next(steps)  # the prefill's token: not a decode step
            start = time.perf_counter()
            for _ in steps:
                pass
            best = max(best, tokens / (time.perf_counter() - start))
    return {"library": Path(lib_path).name if lib_path else None, "tokens_per_s": best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--demo-dir", type=Path, default=ROOT / ".data" / "demo-checkpoint")
    parser.add_argument("--child-lib", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from providers.local.setup import resolve_checkpoint

    checkpoint = resolve_checkpoint(None, args.demo_dir, args.preset)
    if args.child_lib is not None:
        print(json.dumps(measure(checkpoint, args.tokens, args.runs, args.child_lib)))
        return
    from backend.native import build

    work = Path(tempfile.mkdtemp(prefix="native-builds-"))
    variants = {"torch (no kernels)": ""}
    have = set(build._cpu_flags().split())
    levels = {("x86-64-v2", frozenset[str]()), *build.portable_levels()}
    for march, needs in sorted(levels):
        if needs <= have:
            path = build.compile_library(directory=work, portable=march)
            shipped = "the image" if (march, needs) in build.portable_levels() else "not shipped"
            variants[f"portable {march} ({shipped})"] = str(path)
    variants["this CPU (-march=native)"] = str(build.compile_library())
    results = {}
    for name, lib in variants.items():
        done = subprocess.run(
            [sys.executable, __file__, "--child-lib", lib, "--preset", args.preset,
             "--tokens", str(args.tokens), "--runs", str(args.runs),
             "--demo-dir", str(args.demo_dir)],
            capture_output=True,
            text=True,
            check=True,
        )  # fmt: skip
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    base = float(results["torch (no kernels)"]["tokens_per_s"])
    print(f"decode, {args.preset} demo, fp32, 1 thread, {args.tokens} tokens, best of {args.runs}")
    for name, result in results.items():
        rate = float(result["tokens_per_s"])
        print(f"  {name:36s} {rate:8.1f} tokens/s  x{rate / base:.2f}  ({result['library']})")


if __name__ == "__main__":
    main()
