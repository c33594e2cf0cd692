"""A PostgreSQL server of the tests' own: initdb and postgres in a temporary directory on a
free port (as root, run as the `postgres` user, which PostgreSQL requires)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from testkit.gateway_app import closed_port


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if found:
        return Path(found[-1])
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivatePostgres:
    """`start`, `stop` (fast shutdown), `kill` (immediate: as a crash) and `start` again on
    the same data directory. `url(db)`: an asyncpg SQLAlchemy URL."""

    def __init__(self, *, durable: bool = False) -> None:
        """`durable`: fsync on (as in production); the tests' server runs without."""
        self.durable = durable
        bindir = _bindir()
        if bindir is None:
            pytest.skip("PostgreSQL is not installed (scripts/setup.sh installs it)")
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="gw-pg-"))
        self.port = closed_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(
            [*self._as, str(bindir / "initdb"), "-D", str(self.dir / "data"), "-U", "postgres",
             "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [*self._as, str(self.bindir / "postgres"), "-D", str(self.dir / "data"),
             "-p", str(self.port), "-k", str(self.dir), "-c", "listen_addresses=127.0.0.1",
             *([] if self.durable else ["-c", "fsync=off", "-c", "full_page_writes=off"]),
             "-c", "max_connections=200"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                check=False,
            )
            if ready.returncode == 0:
                return
            if self.proc.poll() is not None:
                raise RuntimeError("postgres exited at start")
            time.sleep(0.05)
        raise RuntimeError("postgres did not start")

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        # To the postmaster itself (runuser forwards only some signals), then wait for it.
        pid_file = self.dir / "data" / "postmaster.pid"
        try:
            os.kill(int(pid_file.read_text().split()[0]), sig)
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        self._signal(signal.SIGINT)  # fast shutdown

    def kill(self) -> None:
        self._signal(signal.SIGQUIT)  # immediate shutdown: no checkpoint, crash recovery next

    def create_database(self, name: str) -> None:
        subprocess.run(
            [str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", name],
            check=True,
        )  # fmt: skip

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
