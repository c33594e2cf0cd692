"""A real-shaped slice of DeepSeek-V3.1 on one GPU: one dense layer, three MoE layers and the
MTP layer at the real widths, FP8 resident random weights, the kernels wired in by the model.

Decode steps (batch 1 and 64 over 4K contexts) are held to the bandwidth floor: the bytes a step
must read (dense weights, the experts the batch hits, lm_head, the latent cache) over the
measured HBM copy rate. A prefill chunk is held to the FLOP rate of the activated weights.
"""

from __future__ import annotations

import torch
from torch import nn

from backend.demo_checkpoint import demo_config
from backend.generate import new_cache
from backend.model import fp8
from backend.model.cache import ForwardBatch
from backend.model.checkpoint import prepare_for_kernels
from backend.model.config import ModelConfig
from backend.model.fp8_linear import FP8Linear, make_resident
from backend.model.model import DeepseekV3ForCausalLM
from backend.model.moe import MoE
from benchmarks.kernel_shapes import H200_COPY_BYTES_S, H200_FP8_FLOPS, Widths, measure


def slice_config(w: Widths) -> ModelConfig:
    return ModelConfig.from_dict(
        demo_config(
            "tiny",
            {
                "hidden_size": w.hidden,
                "intermediate_size": w.dense_inter,
                "moe_intermediate_size": w.moe_inter,
                "num_hidden_layers": 4,
                "first_k_dense_replace": 1,
                "num_attention_heads": w.heads,
                "num_key_value_heads": w.heads,
                "q_lora_rank": w.q_lora_rank,
                "kv_lora_rank": w.kv_lora_rank,
                "qk_nope_head_dim": w.nope,
                "qk_rope_head_dim": w.rope,
                "v_head_dim": w.v_head,
                "n_routed_experts": w.experts,
                "num_experts_per_tok": w.top_k,
                "n_group": 8 if w.experts >= 64 else 1,
                "topk_group": 4 if w.experts >= 64 else 1,
                "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"},
            },
        )
    )


@torch.no_grad()
def build_slice(
    config: ModelConfig, device: torch.device, dtype: torch.dtype
) -> DeepseekV3ForCausalLM:
    """Random weights, FP8 where DeepSeek ships FP8, filled on the device tensor by tensor."""
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(config, dtype=dtype, include_mtp=True)
        make_resident(model, {n for n in model.state_dict() if fp8.is_fp8_linear(n)}, (128, 128))
    model.to_empty(device=device)
    for module in model.modules():
        if isinstance(module, FP8Linear):
            module.weight.copy_(torch.randn(module.weight.shape, device=device).to(fp8.FP8_DTYPE))
            module.weight_scale_inv.fill_(module.in_features**-0.5)
    for name, tensor in model.state_dict(keep_vars=True).items():
        if tensor.dtype == fp8.FP8_DTYPE or name.endswith("weight_scale_inv"):
            continue
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif name.endswith("e_score_correction_bias"):
            tensor.zero_()
        else:
            tensor.normal_(0.0, 0.02)
    prepare_for_kernels(model)
    return model.eval()


def _bytes(params: list[nn.Parameter]) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def step_floor_bytes(model: DeepseekV3ForCausalLM, batch: int, context: int) -> float:
    """Bytes one decode step reads: main layers' weights (routed experts by the expected share a
    batch hits), lm_head, the scale grids, and the latent cache."""
    config = model.config
    moe = config.moe
    total = float(
        _bytes(list(model.lm_head.parameters())) + _bytes(list(model.model.norm.parameters()))
    )
    hit_share = 1.0 - (1.0 - moe.num_experts_per_tok / moe.n_routed_experts) ** batch
    for layer in model.model.layers[: config.num_hidden_layers]:
        for module in layer.children():
            if isinstance(module, MoE):
                experts = _bytes(list(module.experts.parameters())) + sum(
                    m.weight_scale_inv.nbytes
                    for m in module.experts.modules()
                    if isinstance(m, FP8Linear)
                )
                rest = [p for n, p in module.named_parameters() if not n.startswith("experts.")]
                total += hit_share * experts + _bytes(rest)
            else:
                total += _bytes(list(module.parameters()))
                total += sum(
                    m.weight_scale_inv.nbytes for m in module.modules() if isinstance(m, FP8Linear)
                )
    cache = config.cache_bytes_per_token(model.dtype) * batch * context
    return total + cache


def bench_slice(w: Widths, device: torch.device) -> list[str]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = slice_config(w)
    model = build_slice(config, device, dtype)
    lines = [f"slice: {config.num_hidden_layers} layers + MTP at hidden {w.hidden}, FP8 resident"]
    context = 4096 if device.type == "cuda" else 64
    for batch in (1, 64) if device.type == "cuda" else (1, 2):
        cache = new_cache(model, batch * context, block_size=w.page)
        blocks = -(-context // w.page)
        tables = [list(range(s * blocks, (s + 1) * blocks)) for s in range(batch)]
        step = ForwardBatch.build([[1]] * batch, [context - 1] * batch, tables, w.page, device)
        seconds = measure(
            lambda cache=cache, step=step: model.compute_logits(model(step, cache)), device
        )
        floor = step_floor_bytes(model, batch, context) / H200_COPY_BYTES_S
        lines.append(
            f"slice decode batch {batch} context {context}: {seconds * 1e3:8.3f} ms/step, "
            f"floor {floor * 1e3:.3f} ms ({floor / seconds:.1%} of the bandwidth floor)"
        )
    chunk = 2048 if device.type == "cuda" else 32
    cache = new_cache(model, chunk, block_size=w.page)
    prefill = ForwardBatch.for_prefill(
        [1] * chunk, 0, list(range(cache.num_blocks)), w.page, device
    )
    seconds = measure(lambda: model(prefill, cache), device)
    moe = config.moe
    activated = sum(p.numel() for p in model.model.layers[: config.num_hidden_layers].parameters())
    experts = sum(
        p.numel() for layer in model.model.layers[: config.num_hidden_layers]
        if isinstance(layer.mlp, MoE) for p in layer.mlp.experts.parameters()
    )  # fmt: skip
    activated -= experts * (1 - moe.num_experts_per_tok / moe.n_routed_experts)
    flops = 2.0 * activated * chunk
    lines.append(
        f"slice prefill {chunk} tokens: {seconds * 1e3:8.1f} ms, {flops / seconds / 1e12:.1f} "
        f"TFLOP/s on the activated weights ({flops / seconds / H200_FP8_FLOPS:.1%} of FP8 peak)"
    )
    return lines
