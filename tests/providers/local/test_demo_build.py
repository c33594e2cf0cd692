"""The demo checkpoint built once under its lock: processes and threads that race on one data
directory build it once and all serve the same files; the builder cleans up what a killed
builder left and never a checkpoint that is written; a waiter that is told to stop gives up;
training progress goes to the log as events (JSON lines under JSON logging, no progress bar
off a terminal)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from backend.demo_train import TrainOptions
from backend.model.checkpoint import INDEX_FILE
from plumbing.file_lock import FileLock
from providers.local import demo_build
from providers.local.deferred import LoadProgress
from providers.local.demo_build import BuildCancelled, build_demo_checkpoint

ROOT = Path(__file__).resolve().parents[3]


class _MarkWaiting(LoadProgress):
    """Progress that leaves a file once its process waits for the lock."""

    def __init__(self, mark: Path) -> None:
        super().__init__()
        self._mark = mark

    def set(self, phase: str, fraction: float | None = None) -> None:
        super().set(phase, fraction)
        if phase.startswith("waiting"):
            self._mark.touch()


def _race(target: str, mark: str, builds: str) -> None:
    """A racing process: build the tiny random demo, noting in `builds` when it writes one."""
    real = demo_build.write_demo_checkpoint

    def counted(out: Path, *args: object, **kw: object) -> Path:
        with open(builds, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return real(out, *args, **kw)  # type: ignore[arg-type]

    demo_build.write_demo_checkpoint = counted  # type: ignore[assignment]
    build_demo_checkpoint(Path(target), "tiny", None, progress=_MarkWaiting(Path(mark)))


def _until(check: object, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.02)


def test_two_processes_racing_build_the_demo_once(tmp_path: Path) -> None:
    target = tmp_path / "tiny"
    builds = tmp_path / "builds.txt"
    held = FileLock(tmp_path / ".tiny.lock").acquire()  # both start while it is held
    ctx = mp.get_context("spawn")
    marks = [tmp_path / f"waiting-{i}" for i in range(2)]
    procs = [
        ctx.Process(target=_race, args=(str(target), str(mark), str(builds))) for mark in marks
    ]
    for proc in procs:
        proc.start()
    try:
        _until(lambda: all(m.exists() for m in marks))  # both wait on the lock
        held.release()
        for proc in procs:
            proc.join(timeout=300)
            assert proc.exitcode == 0
    finally:
        held.release()
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    assert len(builds.read_text().split()) == 1  # one built it, the other reused it
    assert (target / INDEX_FILE).is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tiny")) == [
        ".tiny.lock"
    ]


def test_threads_racing_build_once_and_clean_only_what_a_killed_builder_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "config.json").write_text("{}")  # half-written: no index
    (tmp_path / ".tiny-left").mkdir()  # a killed builder's temporary folder
    writes: list[int] = []
    real = demo_build.write_demo_checkpoint

    def counted(out: Path, *args: object, **kw: object) -> Path:
        writes.append(threading.get_ident())
        return real(out, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(demo_build, "write_demo_checkpoint", counted)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(build_demo_checkpoint(target, "tiny", None)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert results == [target] * 3 and len(writes) == 1
    assert (target / INDEX_FILE).is_file() and not (tmp_path / ".tiny-left").exists()
    stamp = (target / INDEX_FILE).stat().st_mtime_ns
    assert build_demo_checkpoint(target, "tiny", None) == target  # built: left as it is
    assert (target / INDEX_FILE).stat().st_mtime_ns == stamp


def test_a_waiter_reports_the_builders_progress_and_gives_up_when_told(tmp_path: Path) -> None:
    held = FileLock(tmp_path / ".tiny.lock").acquire()
    held.note("4242 45%")  # what a training builder leaves
    progress = LoadProgress()
    cancelled = threading.Event()
    failure: list[BaseException] = []

    def wait() -> None:
        try:
            build_demo_checkpoint(tmp_path / "tiny", "tiny", None, progress=progress,
                                  cancelled=cancelled)  # fmt: skip
        except BaseException as exc:
            failure.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        _until(lambda: progress.describe() == "training demo 45% in process 4242")
        cancelled.set()
        waiter.join(timeout=30)
    finally:
        held.release()
    assert len(failure) == 1 and isinstance(failure[0], BuildCancelled)
    assert not (tmp_path / "tiny").exists()


SHORT_TRAINING = TrainOptions(steps=20, batch_size=2, seq_len=16, max_chars=20_000, threads=1)


def test_training_progress_is_logged_as_events(tmp_path: Path) -> None:
    progress = LoadProgress()
    with capture_logs() as logs:
        build_demo_checkpoint(tmp_path / "tiny-trained", "tiny", SHORT_TRAINING, progress=progress)
    events = [e for e in logs if e["event"] == "demo_training_progress"]
    percents = [e["percent"] for e in events]
    assert percents == sorted(percents) and percents[-1] == 100 and len(events) == 20
    assert all(e["steps"] == 20 and isinstance(e["loss"], float) for e in events)
    assert progress.describe() == "training demo 100%"


def test_under_json_logging_the_progress_is_json_lines_and_no_bar(tmp_path: Path) -> None:
    script = f"""
from pathlib import Path
from backend.demo_train import TrainOptions
from gateway.config.process import LoggingSettings
from gateway.observability.logging import configure_logging
from providers.local.demo_build import build_demo_checkpoint
configure_logging(LoggingSettings(format="json", level="info"))
options = TrainOptions(steps=20, batch_size=2, seq_len=16, max_chars=20_000, threads=1)
build_demo_checkpoint(Path({str(tmp_path / "tiny-trained")!r}), "tiny", options, bar=True)
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    output = done.stdout + done.stderr
    assert b"\r" not in output  # no progress bar: stderr is not a terminal
    lines = [json.loads(line) for line in output.decode().splitlines() if line.strip()]
    progress = [line for line in lines if line["event"] == "demo_training_progress"]
    assert len(progress) == 20 and progress[-1]["percent"] == 100
