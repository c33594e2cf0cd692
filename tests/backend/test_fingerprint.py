"""Checkpoint fingerprints: equal for equal checkpoints, different when config or weights do."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from backend.demo_checkpoint import write_demo_checkpoint
from backend.model.fingerprint import checkpoint_fingerprint


def _small_vocab(out_dir: Path, seed: int) -> Path:
    return write_demo_checkpoint(
        out_dir, "tiny", seed=seed, overrides={"vocab_size": 256}, tokenizer=False
    )


def test_a_copy_has_the_same_fingerprint_and_an_edit_changes_it(
    tiny_dir: Path, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(tiny_dir, tmp_path / "copy"))
    assert checkpoint_fingerprint(copy) == checkpoint_fingerprint(tiny_dir)
    config = copy / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'))
    assert checkpoint_fingerprint(copy) != checkpoint_fingerprint(tiny_dir)


def test_other_weights_of_the_same_shapes_change_it(tmp_path: Path) -> None:
    first = checkpoint_fingerprint(_small_vocab(tmp_path / "a", seed=0))
    assert checkpoint_fingerprint(_small_vocab(tmp_path / "b", seed=0)) == first
    assert checkpoint_fingerprint(_small_vocab(tmp_path / "c", seed=1)) != first


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        checkpoint_fingerprint(tmp_path)
