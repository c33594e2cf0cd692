"""Decode steps of the real-shaped DeepSeek-V3.1 slice launched op by op against replayed from a
CUDA graph, side by side, each held to the step's bandwidth floor.

    python -m benchmarks.decode_graphs            # on a CUDA GPU: V3.1's widths, 4K contexts
    python -m benchmarks.decode_graphs --smoke    # on the CPU: tiny widths, the script checked

The slice is ``benchmarks/kernel_slice.py``'s (one dense layer, three MoE layers and the MTP
layer at the real widths, FP8 resident random weights). Each case is a batch of sequences at
the end of their contexts, with 1 new token each (a plain decode) or 2 (verifying one MTP
draft); the graph runner pads it to its bucket over static buffers and replays its graph (on
the CPU, where nothing is captured, it runs the padded step eagerly). The step's greedy tokens
must agree between both paths. The floor is the bytes a step reads (dense weights, the experts
the batch hits, lm_head, the latent cache) over the H200's measured copy rate.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from backend.engine.graph_runner import DecodeBuffers, DecodeGraphRunner, num_pad_blocks
from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.model import DeepseekV3ForCausalLM
from benchmarks.kernel_shapes import H200_COPY_BYTES_S, REAL, SMOKE, Widths, measure
from benchmarks.kernel_slice import build_slice, slice_config, step_floor_bytes


def bench_case(
    model: DeepseekV3ForCausalLM,
    w: Widths,
    device: torch.device,
    batch: int,
    q_len: int,
    context: int,
) -> str:
    """One (batch, tokens per sequence) case: eager and graph step times, the floor, a check."""
    blocks = -(-context // w.page)
    pad = num_pad_blocks(w.page)
    cache = PagedLatentCache(
        model.num_cache_layers, batch * blocks + pad, w.page, model.config.latent_dim,
        model.dtype, device,
    )  # fmt: skip
    cache.kv.normal_(0.0, 1.0)
    tables = [list(range(s * blocks, (s + 1) * blocks)) for s in range(batch)]
    step = ForwardBatch.build(
        [[1 + s % 7] * q_len for s in range(batch)], [context - q_len] * batch, tables, w.page,
        device,
    )  # fmt: skip
    buffers = DecodeBuffers(
        batch, q_len, blocks, w.page, list(range(batch * blocks, batch * blocks + pad)),
        context, device,
    )  # fmt: skip
    graphs = DecodeGraphRunner(
        model, cache, buffers, (batch,), (q_len,), capture=device.type == "cuda"
    )
    report = graphs.capture()
    rows = torch.arange(step.num_tokens, device=device)
    with torch.inference_mode():
        eager_logits = model.forward_with_logits(step, cache, rows)[1]
        graph_logits = graphs.run(step, batch)[1]
        same = bool(torch.equal(eager_logits.argmax(-1), graph_logits.argmax(-1)))
        eager_s = measure(lambda: model.forward_with_logits(step, cache, rows), device)
        graph_s = measure(lambda: graphs.run(step, batch), device)
    floor = step_floor_bytes(model, batch, context) / H200_COPY_BYTES_S
    how = "graph" if report.num_graphs else "padded eager (no capture)"
    return (
        f"decode batch {batch:3d} x {q_len} tokens, context {context}: eager {eager_s * 1e3:8.3f} "
        f"ms ({eager_s / floor:5.2f}x floor), {how} {graph_s * 1e3:8.3f} ms "
        f"({graph_s / floor:5.2f}x floor), {eager_s / graph_s:5.2f}x faster; floor "
        f"{floor * 1e3:.3f} ms; graph pool {report.graph_bytes / 2**20:.0f} MiB; "
        f"greedy tokens {'equal' if same else 'DIFFER'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny widths on the CPU")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        device, widths, context = torch.device("cpu"), SMOKE, 64
        cases = [(1, 1), (4, 1), (4, 2)]
    elif torch.cuda.is_available():
        device, widths, context = torch.device("cuda"), REAL, 4096
        cases = [(1, 1), (8, 1), (64, 1), (1, 2), (64, 2)]
        print(f"device: {torch.cuda.get_device_name()}")
    else:
        print("no CUDA GPU: run on an H200 (or pass --smoke to check the script)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_slice(slice_config(widths), device, dtype)
    failures = 0
    for batch, q_len in cases:
        line = bench_case(model, widths, device, batch, q_len, context)
        failures += line.endswith("DIFFER")
        print(line, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
