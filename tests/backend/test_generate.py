"""The generate CLI streams exactly the detokenized greedy continuation of the chat prompt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend.demo_checkpoint import write_demo_checkpoint
from backend.generate import generate_greedy, main
from backend.model.checkpoint import load_model
from backend.text.tokenizer import Tokenizer


def test_generate_streams_greedy_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_dir = write_demo_checkpoint(tmp_path, "tiny", seed=4)
    main(["--model", str(model_dir), "--prompt", "Hi there", "--thinking", "--max-tokens", "12"])
    out = capsys.readouterr()
    tokenizer = Tokenizer.from_dir(model_dir)
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Hi there"}], thinking=True)
    assert prompt[-1] == tokenizer.special.think
    generated = generate_greedy(load_model(model_dir, dtype=torch.float32), prompt, 12)
    if tokenizer.special.eos in generated:
        generated = generated[: generated.index(tokenizer.special.eos)]
    assert out.out == "<think>" + tokenizer.decode(generated) + "\n"
    assert f"[{len(prompt)} prompt tokens" in out.err
