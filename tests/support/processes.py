"""Process helpers for tests that spawn serving processes."""

from __future__ import annotations

from pathlib import Path


def process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
