"""Compile this package's C kernels with the system compiler for this CPU and load them.

``cc -O3 -march=native`` builds a shared library on first use, cached under the user's cache
directory by a hash of the source, the flags and the CPU's instruction-set flags (a library built
for one CPU is never loaded on another). Where no compiler is found (a slim container image), a
portable build made ahead of time is loaded instead: ``python -m backend.native.build --portable``
compiles the same sources for each of the architecture's levels (x86-64-v4: AVX-512; x86-64-v3:
AVX2 and FMA, any x86-64 CPU since about 2015; armv8-a on ARM) into ``prebuilt/`` beside this
file (or ``$GATEWAY_NATIVE_PREBUILT``), each named by a hash of the sources and flags, so a stale
one is never loaded; the highest level this CPU has is loaded. Below x86-64-v3 the torch path
serves: the plain SSE build decoded slower than torch (benchmarks/native_builds.py). The
Dockerfile does this in its build stage. No compiler and no portable build, a failed build or a
non-Linux machine gives None: callers then take the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
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
# Per architecture, the portable levels, best first, with the CPU flags each needs.
PORTABLE_LEVELS: dict[str, tuple[tuple[str, frozenset[str]], ...]] = {
    "x86_64": (
        ("x86-64-v4", frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
        ("x86-64-v3", frozenset({"avx2", "fma", "bmi2", "f16c", "movbe"})),
    ),
    "aarch64": (("armv8-a", frozenset()),),
}
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


def _key(flags: tuple[str, ...], cpu: str) -> str:
    texts = [path.read_bytes() for path in (*SOURCES, *HEADERS)]
    return hashlib.sha256(b"\0".join([*texts, " ".join(flags).encode(), cpu.encode()])).hexdigest()


def portable_levels() -> tuple[tuple[str, frozenset[str]], ...]:
    """This machine's architecture's portable levels, best first (march, CPU flags needed)."""
    levels = PORTABLE_LEVELS.get(platform.machine())
    if levels is None:
        raise OSError(f"no portable build for the {platform.machine()} architecture")
    return levels


def portable_flags(march: str) -> tuple[str, ...]:
    return tuple(f"-march={march}" if f == "-march=native" else f for f in FLAGS)


def prebuilt_dir() -> Path:
    return Path(os.environ.get("GATEWAY_NATIVE_PREBUILT") or Path(__file__).with_name("prebuilt"))


def portable_path(march: str, directory: Path | None = None) -> Path:
    """Where the portable build of these sources for level `march` is (or goes)."""
    key = _key(portable_flags(march), "")
    return (directory or prebuilt_dir()) / f"portable-{march}-{key[:16]}.so"


def portable_for_this_cpu(directory: Path | None = None) -> Path | None:
    """The best portable build present that this CPU can run."""
    have = set(_cpu_flags().split())
    for march, needs in portable_levels():
        path = portable_path(march, directory)
        if needs <= have and path.exists():
            return path
    return None


def compile_library(
    extra_flags: tuple[str, ...] = (), directory: Path | None = None, *, portable: str = ""
) -> Path:
    """The path of the built library (built now unless cached): for this CPU, or for the
    `portable` level (a march, into `prebuilt_dir()` unless `directory` says). Raises OSError
    or subprocess.CalledProcessError when there is no compiler or the build fails."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise OSError("no C compiler (cc) on PATH")
    if portable:
        flags = (*portable_flags(portable), *extra_flags)
        target = portable_path(portable, directory)
        out_dir = target.parent
    else:
        flags = (*FLAGS, *extra_flags)
        out_dir = directory or cache_dir()
        target = out_dir / f"gemv-{_key(flags, _cpu_flags())[:16]}.so"
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
        os.chmod(partial, 0o755)  # readable by whichever user serves (a prebuilt one)
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
    """The kernels built for this CPU, else the portable build made ahead of time, or None
    where neither can be had (logged once)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return load_library(compile_library())
    except (OSError, subprocess.SubprocessError) as exc:
        reason: Exception = exc
    try:
        prebuilt = portable_for_this_cpu()
        if prebuilt is not None:
            lib = load_library(prebuilt)
            logger.info("native CPU kernels: the portable build %s (%s)", prebuilt.name, reason)
            return lib
    except OSError as exc:
        reason = exc
    logger.warning("native CPU kernels unavailable, using torch: %s", reason)
    return None


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Build the C kernels ahead of time.")
    parser.add_argument(
        "--portable",
        action="store_true",
        required=True,
        help="for each of the architecture's levels (x86-64-v3, v4 / armv8-a), not this CPU",
    )
    parser.add_argument("--out", type=Path, default=None, help="default: prebuilt/ beside this")
    args = parser.parse_args(argv)
    for march, _ in portable_levels():
        print(compile_library(directory=args.out, portable=march))


if __name__ == "__main__":
    main()
