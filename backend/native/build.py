"""Compile this package's C kernels with the system compiler for this CPU and load them.

``cc -O3 -march=native`` builds a shared library on first use, cached under the user's cache
directory by a hash of the source, the flags and the CPU's instruction-set flags (a library built
for one CPU is never loaded on another). No compiler, a failed build or a non-Linux machine gives
None: callers then take the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("gemv.c", "fused.c", "mla.c"))
HEADERS = (Path(__file__).with_name("dot.h"),)
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=c11")
_I64, _PTR, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
# name: argument types (every function returns an int status, 0 for success)
SIGNATURES: dict[str, list[type]] = {
    "gemv_bf16": [_PTR, _PTR, _PTR, _I64, _I64, _I64],
    "gemv_f32": [_PTR, _PTR, _PTR, _I64, _I64, _I64],
    "rms_norm_bf16": [_PTR, _PTR, _PTR, _I64, _I64, _F32],
    "rms_norm_f32": [_PTR, _PTR, _PTR, _I64, _I64, _F32],
    "moe_bf16": [
        _PTR,
        _I64,
        _I64,
        _PTR,
        _PTR,
        _I64,
        _PTR,
        _PTR,
        _I64,
        _PTR,
        _PTR,
        _PTR,
        _I64,
        _PTR,
    ],
    "moe_f32": [_PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR],
    "mla_decode_bf16": [_PTR, _PTR, _PTR, _PTR, *[_I64] * 2, _PTR, *[_I64] * 5, _F32, _PTR],
    "mla_decode_f32": [_PTR, _PTR, _PTR, _PTR, *[_I64] * 2, _PTR, *[_I64] * 5, _F32, _PTR],
}


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deepseek-gateway" / "native"


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("flags"):
            return line
    return ""


def compile_library(extra_flags: tuple[str, ...] = (), directory: Path | None = None) -> Path:
    """The path of the built library (built now unless cached). Raises OSError or
    subprocess.CalledProcessError when there is no compiler or the build fails."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise OSError("no C compiler (cc) on PATH")
    flags = (*FLAGS, *extra_flags)
    texts = [path.read_bytes() for path in (*SOURCES, *HEADERS)]
    key = hashlib.sha256(b"\0".join([*texts, " ".join(flags).encode(), _cpu_flags().encode()]))
    out_dir = directory or cache_dir()
    target = out_dir / f"gemv-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes building at once never see a partial file.
    fd, partial = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *flags, *map(str, SOURCES), "-o", partial, "-lm"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def load_library(path: Path) -> ctypes.CDLL:
    """The library at ``path`` with its functions' signatures declared."""
    lib = ctypes.CDLL(str(path))
    for name, argtypes in SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
    return lib


@cache
def library() -> ctypes.CDLL | None:
    """The kernels built for this CPU, or None where they cannot be (logged once)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return load_library(compile_library())
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("native CPU kernels unavailable, using torch: %s", exc)
        return None
