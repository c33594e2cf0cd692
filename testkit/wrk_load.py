"""A burst of requests by `wrk` (C, one event loop per thread): the same POST as the Python load
generator, at a fixed number of connections for a fixed time, with wrk's own latency percentiles
and its CPU (user + system of the child process, from rusage)."""

from __future__ import annotations

import json
import re
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# wrk calls `done` once at the end; the JSON line it writes is read back.
_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nRESULT {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, '
    .. '"status_errors": %d, "socket_errors": %d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
"""


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_s: float  # wrk's own CPU


def available() -> bool:
    return shutil.which("wrk") is not None


def script(body: bytes, headers: dict[str, str]) -> Path:
    """A wrk Lua script that POSTs `body` with `headers` and reports as `run` reads it."""
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(body.decode())}"]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    path = Path(tempfile.mkstemp(prefix="bench-", suffix=".lua")[1])
    path.write_text("\n".join(lines) + "\n" + _DONE)
    return path


def run(url: str, lua: Path, connections: int, seconds: float) -> WrkResult:
    """One burst; raises if any answer was not a 2xx or a socket failed."""
    threads = 1 if connections == 1 else 2
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [
            shutil.which("wrk") or "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(seconds, 1.0):g}s",
            "--timeout",
            "10s",
            "-s",
            str(lua),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = re.search(r"^RESULT (.*)$", out, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    result = json.loads(match.group(1))
    if result["status_errors"] or result["socket_errors"] or not result["requests"]:
        raise RuntimeError(f"{url}: wrk saw failures: {result}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return WrkResult(
        result["requests"],
        result["duration_us"] / 1e6,
        result["p50_us"] / 1000,
        result["p99_us"] / 1000,
        cpu,
    )
