"""Tiny demo checkpoints, and copies rewired so that greedy decoding follows fixed token chains.

Rewiring: every attention output and FFN down projection is zeroed, so the final hidden state is
the normed embedding of the current token; each chain token that predicts another gets its own
one-hot embedding direction, and the lm_head row of its successor points along that direction,
so token i of a chain predicts token i + 1 (the last token of a chain, EOS say, predicts nothing).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from backend.demo_checkpoint import write_demo_checkpoint

# lm_head weight of a chain token along its predecessor's direction. The normed one-hot input is
# sqrt(hidden) = 8 there, so the next chain token's logit is 32, far above the random rows' (std
# about 1): greedy and the default temperature 0.6 both follow the chain.
_CHAIN_LOGIT_SCALE = 4.0


def tool_call_text(name: str, arguments: str) -> str:
    """One V3.1 tool call as the model writes it."""
    return (
        f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )


def build_tiny_checkpoint(out_dir: Path) -> Path:
    return write_demo_checkpoint(out_dir, "tiny", seed=0, dtype=torch.float32)


def rewire_checkpoint(tiny_dir: Path, out_dir: Path, chains: Sequence[Sequence[int]]) -> Path:
    """A copy of the checkpoint at `tiny_dir` whose greedy output follows `chains`."""
    hidden = int(json.loads((tiny_dir / "config.json").read_text())["hidden_size"])
    predecessors = [token for chain in chains for token in chain[:-1]]
    assert len(set(predecessors)) == len(predecessors), "a token may predict only one other"
    assert len(predecessors) <= hidden, "each chain token needs its own embedding direction"
    direction = {token: i for i, token in enumerate(predecessors)}
    successors = {token for chain in chains for token in chain[1:]}
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in tiny_dir.iterdir():
        if path.suffix != ".safetensors":
            (out_dir / path.name).write_bytes(path.read_bytes())
            continue
        tensors = load_file(path)
        for name, tensor in tensors.items():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                tensor.zero_()
            elif name == "model.norm.weight":
                tensor.fill_(1.0)
            elif name == "model.embed_tokens.weight":
                for token, i in direction.items():
                    tensor[token] = torch.nn.functional.one_hot(torch.tensor(i), hidden).float()
            elif name == "lm_head.weight":
                for token in successors:
                    tensor[token].zero_()
                for chain in chains:
                    for before, after in zip(chain, chain[1:], strict=False):
                        tensor[after, direction[before]] = _CHAIN_LOGIT_SCALE
        save_file(tensors, out_dir / path.name, metadata={"format": "pt"})
    return out_dir


def write_hf_checkpoint(like: Path, out_dir: Path, seed: int = 5) -> Path:
    """A checkpoint written by HF transformers (`save_pretrained`, its own tensor names and
    file layout) with the architecture of the checkpoint at `like` and random weights of its
    own, and `like`'s tokenizer and generation config beside it."""
    from transformers import DeepseekV3Config
    from transformers import DeepseekV3ForCausalLM as HFDeepseekV3

    raw = json.loads((like / "config.json").read_text())
    raw["num_nextn_predict_layers"] = 0  # HF's model has no MTP layer
    torch.manual_seed(seed)
    HFDeepseekV3(DeepseekV3Config(**raw)).save_pretrained(out_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (like / name).exists():
            (out_dir / name).write_bytes((like / name).read_bytes())
    return out_dir
