"""Our engine's logits and greedy continuations equal HF transformers' DeepseekV3ForCausalLM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DeepseekV3ForCausalLM as HFDeepseekV3
from transformers.modeling_layers import MtpLayer
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3DecoderLayer,
    DeepseekV3RMSNorm,
)

from backend.demo_checkpoint import write_demo_checkpoint
from backend.generate import generate_greedy, logits_for, new_cache
from backend.model.cache import ForwardBatch
from backend.model.checkpoint import load_model
from backend.model.model import DecoderLayer, DeepseekV3ForCausalLM


def _hf(model_dir: Path) -> HFDeepseekV3:
    return HFDeepseekV3.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_tiny(tiny_dir: Path) -> HFDeepseekV3:
    return _hf(tiny_dir)


def _prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 129280, (length,), generator=generator).tolist()


def _assert_logits_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    error = (ours - theirs).abs().max() / theirs.abs().max()
    assert error < 1e-4, f"max relative logit error {error:.2e}"


@pytest.mark.parametrize("length", [1, 7, 33, 300])
def test_logits_match_hf(
    tiny_model: DeepseekV3ForCausalLM, hf_tiny: HFDeepseekV3, length: int
) -> None:
    # 300 tokens passes the original 256-token context: YaRN's stretched range is used.
    prompt = _prompt(length, seed=length)
    with torch.no_grad():
        theirs = hf_tiny(torch.tensor([prompt])).logits[0]
    _assert_logits_close(logits_for(tiny_model, prompt), theirs)


def test_greedy_continuation_matches_hf(
    tiny_model: DeepseekV3ForCausalLM, hf_tiny: HFDeepseekV3
) -> None:
    prompt = _prompt(12, seed=99)
    ours = generate_greedy(tiny_model, prompt, 64, block_size=16)
    with torch.no_grad():
        out = hf_tiny.generate(
            torch.tensor([prompt]), max_new_tokens=64, do_sample=False, eos_token_id=None
        )
    assert ours == out[0, len(prompt) :].tolist()


def test_q_proj_variant_matches_hf(tmp_path: Path) -> None:
    # q_lora_rank null: one q_proj; a single group (no group limiting) and a small vocab.
    overrides = {"q_lora_rank": None, "n_group": 1, "topk_group": 1, "vocab_size": 1000}
    model_dir = write_demo_checkpoint(
        tmp_path, "tiny", seed=3, overrides=overrides, tokenizer=False
    )
    ours = load_model(model_dir)
    assert isinstance(ours.model.layers[0], DecoderLayer)
    assert ours.model.layers[0].self_attn.q_proj is not None
    prompt = _prompt(20, seed=5)
    prompt = [t % 1000 for t in prompt]
    with torch.no_grad():
        theirs = _hf(model_dir)(torch.tensor([prompt])).logits[0]
    _assert_logits_close(logits_for(ours, prompt), theirs)


def _hf_mtp_layer(ours: DeepseekV3ForCausalLM, hf_model: HFDeepseekV3) -> MtpLayer:
    """HF's generic MTP layer around its DeepseekV3DecoderLayer, holding our MTP weights."""
    config = ours.config
    index = config.num_hidden_layers
    layer = MtpLayer(hf_model.config, DeepseekV3DecoderLayer, DeepseekV3RMSNorm, index).eval()
    prefix = f"model.layers.{index}."
    ours_state = {
        k.removeprefix(prefix): v for k, v in ours.state_dict().items() if k.startswith(prefix)
    }
    state: dict[str, torch.Tensor] = {"post_norm.weight": ours_state["shared_head.norm.weight"]}
    for name, tensor in ours_state.items():
        if name.startswith(("enorm.", "hnorm.", "eh_proj.")):
            state[name] = tensor
        elif not name.startswith(("shared_head.", "mlp.experts.")):
            state[f"mtp_block.{name}"] = tensor
    experts = range(config.moe.n_routed_experts)
    state["mtp_block.mlp.experts.gate_up_proj"] = torch.stack(
        [
            torch.cat(
                (
                    ours_state[f"mlp.experts.{e}.gate_proj.weight"],
                    ours_state[f"mlp.experts.{e}.up_proj.weight"],
                )
            )
            for e in experts
        ]
    )
    state["mtp_block.mlp.experts.down_proj"] = torch.stack(
        [ours_state[f"mlp.experts.{e}.down_proj.weight"] for e in experts]
    )
    layer.load_state_dict(state, strict=True)
    return layer


def test_mtp_layer_matches_hf(tiny_model: DeepseekV3ForCausalLM, hf_tiny: HFDeepseekV3) -> None:
    # Draft input at position t: token t+1 and the main model's final hidden state at t.
    tokens = _prompt(21, seed=11)
    length = len(tokens) - 1
    cache = new_cache(tiny_model, length)
    table = list(range(cache.num_blocks))
    hidden = tiny_model(ForwardBatch.for_prefill(tokens[:length], 0, table, 16), cache)
    draft_batch = ForwardBatch.for_prefill(tokens[1:], 0, table, 16)
    ours = tiny_model.mtp_forward(draft_batch, cache, hidden)
    layer = _hf_mtp_layer(tiny_model, hf_tiny)
    positions = torch.arange(length)[None]
    with torch.no_grad():
        embeds = hf_tiny.model.embed_tokens(torch.tensor([tokens[1:]]))
        theirs = layer(
            embeds,
            hidden[None],
            position_embeddings=hf_tiny.model.rotary_emb(embeds, positions),
            attention_mask=None,
            position_ids=positions,
            cache=None,
        )[0]
    error = (ours - theirs).abs().max() / theirs.abs().max()
    assert error < 1e-4, f"relative error {error:.2e}"
    assert tiny_model.compute_draft_logits(ours).shape == (length, 129280)


def test_mtp_decode_step_equals_mtp_prefill(tiny_model: DeepseekV3ForCausalLM) -> None:
    tokens = _prompt(17, seed=12)
    length = len(tokens) - 1
    cache = new_cache(tiny_model, length, block_size=4)
    table = list(range(cache.num_blocks))
    hidden = tiny_model(ForwardBatch.for_prefill(tokens[:length], 0, table, 4), cache)
    draft_all = tiny_model.mtp_forward(
        ForwardBatch.for_prefill(tokens[1:], 0, table, 4), cache, hidden
    )
    # Redo the last draft position as a single-token (absorbed) step over the MTP cache layer.
    last = ForwardBatch.for_prefill(tokens[-1:], length - 1, table, 4)
    draft_last = tiny_model.mtp_forward(last, cache, hidden[-1:])
    torch.testing.assert_close(draft_last[0], draft_all[-1], rtol=1e-5, atol=1e-5)
