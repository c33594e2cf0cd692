"""The demo training path runs end to end on a few steps and writes a loadable checkpoint whose
model and MTP layer moved away from the random start (the full run is minutes: not here)."""

from __future__ import annotations

from pathlib import Path

import torch

from backend.demo_checkpoint import write_demo_checkpoint
from backend.demo_train import TrainOptions
from backend.model.checkpoint import load_model


def test_a_few_training_steps_move_model_and_mtp_weights(tmp_path: Path) -> None:
    options = TrainOptions(
        steps=3,
        batch_size=2,
        seq_len=16,
        max_chars=20_000,
        warmup_steps=1,
        fim_rate=0.5,  # plain and fill-in-the-middle windows
        progress=False,
        threads=1,
    )
    untrained = write_demo_checkpoint(tmp_path / "random", "tiny", seed=0, dtype=torch.float32)
    trained = write_demo_checkpoint(
        tmp_path / "trained", "tiny", seed=0, dtype=torch.float32, train=options
    )
    before = load_model(untrained).state_dict()
    after = load_model(trained).state_dict()
    assert before.keys() == after.keys()
    mtp = f"model.layers.{load_model(trained).config.num_hidden_layers}."
    moved = {name for name in after if not torch.equal(before[name], after[name])}
    assert any(name.startswith(mtp) for name in moved), "the MTP layer was not trained"
    assert any(not name.startswith(mtp) for name in moved), "the model was not trained"
    assert all(torch.isfinite(tensor).all() for tensor in after.values())
