"""An append-only file of settlements Redis could not take, replayed when it is back.

Each process appends JSON lines to a file of its own under the spool directory, which it holds
locked (`flock`) while it lives. At start, a process adopts every file no live process holds:
their settlements are copied into its own file (made durable) before the old file is removed,
so a crash at any point loses nothing (a settlement kept twice is applied once: settlement is
idempotent by request token). When every settlement it holds has reached Redis, the file is
emptied. A line cut short by a crash mid-write is skipped.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
from pathlib import Path
from typing import IO

import structlog

from gateway.keys.limiter import Settlement

log = structlog.get_logger("gateway.spool")


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / f"settlements-{os.getpid()}-{secrets.token_hex(4)}.jsonl"
        self._file: IO[str] | None = None
        self._lock = asyncio.Lock()

    async def append(self, settlements: list[Settlement]) -> None:
        """Write settlements to disk (fsync'd) before they count as kept."""
        lines = "".join(json.dumps(s.to_json(), separators=(",", ":")) + "\n" for s in settlements)
        async with self._lock:
            await asyncio.to_thread(self._write, lines)

    async def clear(self) -> None:
        """Empty the file: everything in it has reached Redis."""
        async with self._lock:
            if self._file is not None:
                await asyncio.to_thread(self._file.truncate, 0)

    async def adopt(self) -> list[Settlement]:
        """Take over the files of processes that are gone; their settlements, now in ours."""
        async with self._lock:
            return await asyncio.to_thread(self._adopt)

    def close(self) -> None:
        """Release the file; it stays (with what it holds) for the next start unless empty."""
        if self._file is None:
            return
        if os.fstat(self._file.fileno()).st_size == 0:
            self.path.unlink(missing_ok=True)
        self._file.close()  # closing releases the lock
        self._file = None

    def _open(self) -> IO[str]:
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held for life)
            fcntl.flock(file, fcntl.LOCK_EX)
            self._file = file
        return self._file

    def _write(self, lines: str) -> None:
        file = self._open()
        file.write(lines)
        file.flush()
        os.fsync(file.fileno())

    def _adopt(self) -> list[Settlement]:
        if not self.directory.is_dir():
            return []
        adopted: list[Settlement] = []
        for path in sorted(self.directory.glob("settlements-*.jsonl")):
            if path == self.path:
                continue
            with open(path, encoding="utf-8") as file:
                try:
                    fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live process's spool
                found = _parse(file.read(), path)
                if found:
                    self._write("".join(json.dumps(s.to_json()) + "\n" for s in found))
                path.unlink()
            adopted += found
        if adopted:
            log.warning("settlements_adopted", count=len(adopted))
        return adopted


def _parse(text: str, path: Path) -> list[Settlement]:
    found: list[Settlement] = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            found.append(Settlement.from_json(json.loads(line)))
        except (ValueError, TypeError, KeyError):
            log.error("spool_line_unreadable", path=str(path), line=number)
    return found
