"""Every kernel configuration the wrappers launch on a GPU compiles for Hopper (sm_90) with
Triton's own ptxas, on a machine without a GPU: the CUDA path's bf16 and FP8 dots and its
tiles, which the interpreter-run tests never compile. In a child process, since the kernels
must be defined without ``TRITON_INTERPRET``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.machine import scaled

pytest.importorskip("triton")
pytestmark = pytest.mark.triton
# Compiling every configuration took 66 s on a 2-core machine at load average 14.
DEADLINE_S = scaled(180)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(DEADLINE_S + 30)
def test_every_configuration_compiles_for_hopper() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns while it is unset
    done = subprocess.run(
        [sys.executable, "-m", "backend.kernels.compile_check", "--arch", "90"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "0 failed"
    assert sum(line.startswith("ok") for line in lines) == 27  # every configuration listed
