"""The engine's policy (scheduler, block manager, engine config) and its tests need no torch; nor
does a serving worker without the engine (it reaches worker 0's over a socket)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_BLOCK_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this check")
sys.meta_path.insert(0, _NoTorch())
"""

_MODULES = [
    "backend.engine.scheduler",
    "backend.engine.blocks",
    "backend.engine.block_hash",
    "backend.engine.engine_config",
    "backend.engine.spec_policy",
    "gateway.config.settings",
    "backend.engine.interface",
    "providers.local.provider",
    "providers.local.remote_engine",
    "providers.local.worker_engine",
    "gateway.engine_host.worker_share",
    "gateway.cluster.internal",
    "tests.backend.conftest",
    "tests.backend.test_scheduler",
    "tests.backend.test_blocks",
    "tests.backend.test_spec_policy",
]


def test_policy_modules_and_their_tests_import_without_torch() -> None:
    code = _BLOCK_TORCH + "".join(f"import {name}\n" for name in _MODULES)
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
