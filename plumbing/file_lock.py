"""An exclusive lock on a file (`flock`), shared by processes on one host or one volume.

`FileLock.acquire` waits for the lock, polling so that a waiter can give up (`cancelled`) and
say what it is waiting for (`on_wait(note)`, with the holder's note). The holder may leave a
one-line note in the file (`note`), for instance how far its work is; the lock goes with the
descriptor, so a holder that dies releases it at once. Blocking: call it from a thread in
async code.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType


class LockCancelled(Exception):
    """The wait was given up (`cancelled` was set)."""


class FileLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(
        self,
        *,
        poll_s: float = 0.5,
        cancelled: threading.Event | None = None,
        on_wait: Callable[[str], None] | None = None,
    ) -> FileLock:
        """Hold the lock; until it is free, every `poll_s` tell `on_wait` the holder's note and
        raise `LockCancelled` once `cancelled` is set."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if cancelled is not None and cancelled.is_set():
                        raise LockCancelled(f"gave up waiting for {self.path}") from None
                    if on_wait is not None:
                        on_wait(self.read_note())
                    time.sleep(poll_s)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.note(str(os.getpid()))
        return self

    def note(self, text: str) -> None:
        """Leave `text` (one line) in the file for waiters to read."""
        if self._fd is None:
            raise RuntimeError("the lock is not held")
        data = text.replace("\n", " ").encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def read_note(self) -> str:
        try:
            return self.path.read_text(errors="replace").strip()
        except OSError:
            return ""

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> FileLock:
        return self if self._fd is not None else self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
