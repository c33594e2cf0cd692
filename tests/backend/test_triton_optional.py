"""The model imports, loads and runs on a machine without triton: kernel modules import it
only when a wrapper launches a kernel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_BLOCK_TRITON = """
import importlib.abc, sys
class _NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("triton is blocked in this check")
sys.meta_path.insert(0, _NoTriton())
"""

_RUN = """
import sys
import torch
from backend.generate import generate_greedy
from backend.kernels import support
from backend.model.checkpoint import load_model
from backend.kernels.fp8_gemm import act_quant
assert not support.triton_installed()
model = load_model(sys.argv[1])
assert generate_greedy(model, [5, 6, 7], 2)
try:
    act_quant(torch.ones(2, 128))
except RuntimeError as exc:
    assert "triton is not installed" in str(exc)
else:
    raise AssertionError("a wrapper ran without triton")
"""


def test_model_runs_without_triton(tiny_fp8_dir: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_TRITON + _RUN, str(tiny_fp8_dir)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
