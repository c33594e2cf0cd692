"""The cluster's publisher and follower as they were before index format 2 (a node of one
block pool; events without ranks), loaded from the repository's history, so mixed-format tests
run the real older code rather than an imitation of it."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

# the last commit whose gateway/cluster reads and writes index format 1 alone
FORMAT_1_COMMIT = "7dee8502ea74eddb0827e5b4082c329ff6bd83c4"
_MODULES = ("events", "index", "keys", "publisher", "follower")
_PACKAGE = "old_cluster_format1"


def load_format_1() -> types.ModuleType:
    """A package `old_cluster_format1` with those five modules; skips the test where the
    repository's history is not at hand (a source tarball)."""
    if _PACKAGE in sys.modules:
        return sys.modules[_PACKAGE]
    root = Path(__file__).resolve().parents[2]
    sources: dict[str, str] = {}
    for name in _MODULES:
        shown = subprocess.run(
            ["git", "-C", str(root), "show", f"{FORMAT_1_COMMIT}:gateway/cluster/{name}.py"],
            capture_output=True,
            text=True,
            check=False,
        )
        if shown.returncode != 0:
            pytest.skip(f"the format 1 code is not in this checkout's history: {shown.stderr}")
        sources[name] = shown.stdout
    package = types.ModuleType(_PACKAGE)
    package.__path__ = []
    sys.modules[_PACKAGE] = package
    for name in _MODULES:
        source = sources[name]
        for other in _MODULES:
            source = source.replace(f"gateway.cluster.{other} ", f"{_PACKAGE}.{other} ")
        module = types.ModuleType(f"{_PACKAGE}.{name}")
        module.__file__ = f"<{FORMAT_1_COMMIT[:7]}:gateway/cluster/{name}.py>"
        sys.modules[module.__name__] = module
        exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102
        setattr(package, name, module)
    return package
