"""Prefill and decode speed of our model vs HF transformers on one checkpoint, and the floor.

``python benchmarks/model_forward.py [--model DIR] [--dtype bfloat16] [--threads N]``

Without ``--model`` the "small" demo checkpoint is written to a temporary directory. Decode is
memory-bound at batch 1: a step reads every dense weight, the k routed experts of each MoE layer,
the lm_head, and the latent cache; the floor is those bytes over measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import DeepseekV3ForCausalLM as HFDeepseekV3
from transformers import DynamicCache

from backend.demo_checkpoint import write_demo_checkpoint
from backend.generate import new_cache
from backend.model.cache import ForwardBatch
from backend.model.checkpoint import load_model
from backend.model.dtypes import torch_dtype
from backend.model.model import DeepseekV3ForCausalLM
from backend.model.moe import MoE


def copy_bandwidth(num_bytes: int = 1 << 29, repeats: int = 5) -> float:
    """Bytes per second moved (read + write) by the best of ``repeats`` large tensor copies."""
    src = torch.ones(num_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * num_bytes / best


def cpu_description() -> str:
    """The CPU model and the instruction-set flags that decide matmul speed (Linux only)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "cpu: unknown"
    fields: dict[str, str] = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    model = fields.get("model name", "unknown")
    return f"cpu: {model}  flags: {' '.join(f for f in wanted if f in flags) or 'none of note'}"


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def decode_bytes(model: DeepseekV3ForCausalLM, context: int) -> int:
    """Bytes one batch-1 decode step must read: weights touched plus the latent cache."""
    config = model.config
    total = 0
    for name, param in model.named_parameters():
        if name.startswith("model.embed_tokens") or ".mlp.experts." in name:
            continue
        total += param.numel() * param.element_size()
    total += config.hidden_size * model.dtype.itemsize  # one embedding row
    for layer in model.model.layers[: config.num_hidden_layers]:
        if isinstance(layer.mlp, MoE):
            expert = sum(p.numel() * p.element_size() for p in layer.mlp.experts[0].parameters())
            total += config.moe.num_experts_per_tok * expert
    return total + config.cache_bytes_per_token(model.dtype) * context


def ours_prefill(model: DeepseekV3ForCausalLM, ids: list[int]) -> float:
    cache = new_cache(model, len(ids))
    batch = ForwardBatch.for_prefill(ids, 0, list(range(cache.num_blocks)), cache.block_size)
    return _timed(lambda: model.compute_logits(model(batch, cache)[-1:]))


def ours_decode(model: DeepseekV3ForCausalLM, ids: list[int], steps: int) -> list[float]:
    cache = new_cache(model, len(ids) + steps)
    table = list(range(cache.num_blocks))
    hidden = model(ForwardBatch.for_prefill(ids, 0, table, cache.block_size), cache)
    token = int(model.compute_logits(hidden[-1:]).argmax())
    times = []
    for step in range(steps):
        start = time.perf_counter()
        batch = ForwardBatch.for_prefill([token], len(ids) + step, table, cache.block_size)
        token = int(model.compute_logits(model(batch, cache)).argmax())
        times.append(time.perf_counter() - start)
    return times


@torch.inference_mode()
def hf_prefill(model: HFDeepseekV3, ids: list[int]) -> float:
    return _timed(lambda: model(torch.tensor([ids]), logits_to_keep=1))


@torch.inference_mode()
def hf_decode(model: HFDeepseekV3, ids: list[int], steps: int) -> list[float]:
    cache = DynamicCache(config=model.config)
    out = model(torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
    token = out.logits[0, -1].argmax()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        out = model(token.view(1, 1), cache=cache, use_cache=True)
        token = out.logits[0, -1].argmax()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--context", type=int, default=256, help="prompt before decoding")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch_dtype(args.dtype)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or write_demo_checkpoint(Path(scratch) / "small", "small")
        ours = load_model(model_dir, dtype=dtype, load_mtp=False)
        hf = HFDeepseekV3.from_pretrained(model_dir, dtype=dtype).eval()
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 129280, (args.prefill_tokens,), generator=generator).tolist()
    context = prompt[: args.context]
    ours_prefill(ours, prompt[:32])  # warm up both
    hf_prefill(hf, prompt[:32])
    # Alternate ours and HF so both see the same machine load; keep each one's best round.
    ours_p = hf_p = ours_d = hf_d = float("inf")
    for _ in range(args.rounds):
        ours_p = min(ours_p, ours_prefill(ours, prompt))
        hf_p = min(hf_p, hf_prefill(hf, prompt))
        ours_d = min(ours_d, statistics.median(ours_decode(ours, context, args.decode_steps)))
        hf_d = min(hf_d, statistics.median(hf_decode(hf, context, args.decode_steps)))
    bandwidth = copy_bandwidth()
    step_bytes = decode_bytes(ours, args.context + args.decode_steps // 2)
    floor = step_bytes / bandwidth
    n = args.prefill_tokens
    print(f"checkpoint {model_dir}  dtype {args.dtype}  threads {args.threads}")
    print(cpu_description())
    print(
        f"prefill {n} tokens: ours {n / ours_p:9.0f} tok/s   HF {n / hf_p:9.0f} tok/s   "
        f"ours/HF {hf_p / ours_p:5.2f}x"
    )
    print(
        f"decode (context {args.context}): ours {ours_d * 1e3:7.2f} ms/token   "
        f"HF {hf_d * 1e3:7.2f} ms/token   ours/HF speed {hf_d / ours_d:5.2f}x"
    )
    print(
        f"copy bandwidth {bandwidth / 1e9:6.1f} GB/s   bytes per decode step "
        f"{step_bytes / 1e6:7.1f} MB   floor {floor * 1e3:6.2f} ms/token"
    )
    print(f"ours decode = {ours_d / floor:5.2f}x floor   HF decode = {hf_d / floor:5.2f}x floor")


if __name__ == "__main__":
    main()
