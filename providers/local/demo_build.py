"""Build the demo checkpoint once per data directory, however many processes start on it.

Processes sharing `demo_dir` (replicas on one volume, workers, a second `serve`) take the file
lock `demo_dir/.<name>.lock` (plumbing/file_lock.py) before building: one builds, into a
temporary directory it renames into place, and the others wait, then find it built and reuse
it. Only the lock holder removes anything (a half-written folder, or a temporary directory a
killed builder left), and never a checkpoint whose index is written, so no process removes what
another is loading. While it trains, the holder leaves its progress in the lock file, and the
waiters report it as their own.

Progress goes to `LoadProgress` (readiness), and to the log as `demo_training_progress` events
every 5% (JSON lines under JSON logging; the training's own progress bar is shown only where
stderr is a terminal and the log is for people).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import structlog

from backend.demo_checkpoint import write_demo_checkpoint
from backend.demo_train import TrainOptions
from backend.model.checkpoint import INDEX_FILE
from plumbing.file_lock import FileLock
from providers.local.deferred import LoadProgress

log = structlog.get_logger("providers.local.provider")

LOG_TIMES = 20  # progress events per training run (one per 5% of its steps)
TRAINING = "training demo"


class BuildCancelled(Exception):
    """The process is stopping: the build was given up (nothing is left in place)."""


def build_demo_checkpoint(
    target: Path,
    preset: str,
    train: TrainOptions | None,
    *,
    progress: LoadProgress | None = None,
    cancelled: threading.Event | None = None,
    bar: bool = False,
) -> Path:
    """`target` built (or found built by another process) under the directory's lock.
    `train`: the training run (None: random weights); `bar`: the training's progress bar (on a
    terminal). Raises `BuildCancelled` once `cancelled` is set. Blocking."""
    progress = progress if progress is not None else LoadProgress()
    demo_dir = target.parent
    demo_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(demo_dir / f".{target.name}.lock")

    def waiting(note: str) -> None:
        held_by, _, how_far = note.partition(" ")
        held_by = held_by or "?"
        if how_far:  # its training's progress, as the holder left it
            progress.set(f"{TRAINING} {how_far} in process {held_by}")
        else:
            progress.set(f"waiting for process {held_by} to build the demo")

    try:
        lock.acquire(cancelled=cancelled, on_wait=waiting)
    except Exception as exc:  # LockCancelled
        raise BuildCancelled(str(exc)) from None
    try:
        if (target / INDEX_FILE).is_file():  # another process built it meanwhile
            log.info("demo_checkpoint_reused", path=str(target), built_by="another process")
            return target
        for left in demo_dir.glob(f".{target.name}-*"):  # a killed builder's temporary folder
            shutil.rmtree(left, ignore_errors=True)
        log.info("demo_checkpoint_build_started", path=str(target), trained=train is not None)
        reporter = _Reporter(progress, lock, cancelled)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=demo_dir))
        try:
            progress.set(TRAINING if train is not None else "writing demo", 0.0)
            write_demo_checkpoint(
                staging,
                preset,
                train=replace(train, progress=bar) if train is not None else None,
                report=reporter,
            )
            shutil.rmtree(target, ignore_errors=True)  # half-written (no index): never loaded
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target
    finally:
        lock.release()


class _Reporter:
    """Each training step: progress for readiness, the lock's note for the waiters, and a log
    event at each `1 / LOG_TIMES` of the run."""

    def __init__(
        self, progress: LoadProgress, lock: FileLock, cancelled: threading.Event | None
    ) -> None:
        self._progress = progress
        self._lock = lock
        self._cancelled = cancelled
        self._logged = -1

    def __call__(self, step: int, steps: int, loss: float) -> None:
        if self._cancelled is not None and self._cancelled.is_set():
            raise BuildCancelled("the process is stopping")
        fraction = step / steps
        self._progress.set(TRAINING, fraction)
        mark = step * LOG_TIMES // steps
        if mark != self._logged:
            self._logged = mark
            percent = int(fraction * 100)
            self._lock.note(f"{os.getpid()} {percent}%")
            log.info(
                "demo_training_progress",
                step=step,
                steps=steps,
                percent=percent,
                loss=round(loss, 3),
            )
