"""Open the local-engine provider: find or build the checkpoint, load, start, stop.

With no model path configured, a demo checkpoint of the chosen preset is built once and reused on
later starts (providers/local/demo_build.py: under a file lock, so processes sharing the directory
build it once; into a temporary directory renamed into place, so a half-written build is never
reused): "trained" weights (`demo_dir/<preset>-trained`: the model and its MTP layer trained on the
standard library's Python source, plain and fill-in-the-middle; `DEMO_TRAINING` sizes it to about
2.5 minutes on two busy cores for the tiny preset) or "random" weights (`demo_dir/<preset>`,
seconds). The start-up log says which weights are served; `progress` says how far the load is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path

import structlog
import torch

from backend.demo_checkpoint import PRESETS
from backend.demo_train import TrainOptions
from backend.engine.async_engine import AsyncEngine
from backend.engine.blocks import BlockEvent
from backend.engine.engine_config import EngineConfig
from backend.model.checkpoint import INDEX_FILE
from backend.text.tokenizer import Tokenizer
from providers.local.deferred import LoadProgress
from providers.local.demo_build import build_demo_checkpoint
from providers.local.engine_client import EnginePlacer
from providers.local.provider import LocalProvider

log = structlog.get_logger("providers.local.provider")

DEFAULT_MODEL_ID = "deepseek-v3.1"
# The trained demo's run: 400 steps (141 s on two cores at a load average of 4, 236 s at 12), 30%
# of the windows in the FIM layout so FIM prompts get code back; lr 1e-2 reached a loss of 5.8 where
# 5e-3 with half the windows FIM reached 6.5.
DEMO_TRAINING = TrainOptions(steps=400, lr=1e-2, fim_rate=0.3, threads=1)


def demo_checkpoint_dir(demo_dir: Path, preset: str, *, trained: bool = False) -> Path:
    return demo_dir / (f"{preset}-trained" if trained else preset)


def _weights(trained: bool) -> str:
    if trained:
        return "trained demo (a demo of the architecture: its answers are not useful text)"
    return "random (answers are random tokens)"


def check_checkpoint(model_path: Path | None, demo_preset: str) -> None:
    """Refuse at once what `resolve_checkpoint` would refuse after a wait: a model path
    without config.json, an unknown demo preset."""
    if model_path is not None:
        if not (model_path / "config.json").is_file():
            raise FileNotFoundError(f"engine.model_path {model_path} has no config.json")
    elif demo_preset not in PRESETS:
        raise ValueError(f"unknown demo preset {demo_preset!r}; choose from {sorted(PRESETS)}")


def resolve_checkpoint(
    model_path: Path | None,
    demo_dir: Path,
    demo_preset: str,
    *,
    trained: bool = False,
    progress: LoadProgress | None = None,
    cancelled: threading.Event | None = None,
    bar: bool = True,
) -> Path:
    """The checkpoint directory to serve: `model_path`, else the demo checkpoint, `trained` or
    random (built when missing, once across processes; `bar`: the training's progress bar
    where stderr is a terminal). Blocking: run it in a thread from async code."""
    check_checkpoint(model_path, demo_preset)
    if model_path is not None:
        log.info("checkpoint", path=str(model_path), weights="from engine.model_path")
        return model_path
    target = demo_checkpoint_dir(demo_dir, demo_preset, trained=trained)
    weights = _weights(trained)
    if (target / INDEX_FILE).is_file():
        log.info("demo_checkpoint_reused", path=str(target), preset=demo_preset, weights=weights)
        return target
    log.info(
        "demo_checkpoint_building",
        path=str(target),
        preset=demo_preset,
        weights=weights,
        note="training: a few minutes, once" if trained else "seconds",
    )
    build_demo_checkpoint(
        target,
        demo_preset,
        DEMO_TRAINING if trained else None,
        progress=progress,
        cancelled=cancelled,
        bar=bar,
    )
    log.info("demo_checkpoint_built", path=str(target), preset=demo_preset, weights=weights)
    return target


class _LoadReport:
    """The weights' load: progress for readiness ("loading checkpoint 45%"), and an
    `engine_load_progress` log event at each tenth."""

    def __init__(self, progress: LoadProgress) -> None:
        self._progress = progress
        self._logged = -1

    def __call__(self, done: int, total: int) -> None:
        self._progress.set("loading checkpoint", done / total)
        tenth = done * 10 // total
        if tenth != self._logged:
            self._logged = tenth
            log.info("engine_load_progress", tensors=done, of=total, percent=done * 100 // total)


@asynccontextmanager
async def load_local_provider(
    name: str,
    config: EngineConfig,
    *,
    model_path: Path | None = None,
    demo_dir: Path = Path(".data/demo-checkpoint"),
    demo_preset: str = "small",
    demo_trained: bool = False,
    model_id: str = DEFAULT_MODEL_ID,
    on_block_event: Callable[[BlockEvent], None] | None = None,
    open_placer: Callable[[AsyncEngine], AbstractAsyncContextManager[EnginePlacer]] | None = None,
    progress: LoadProgress | None = None,
    cancelled: threading.Event | None = None,
    bar: bool = True,
) -> AsyncIterator[LocalProvider]:
    """A started LocalProvider over `config`'s engine; the engine stops on exit. The engine
    is the process's one user of torch, so torch's threads are set here, once.
    `on_block_event` hears the engine's prefix-cache events; `open_placer(engine)` gives the
    placer that may send prompts to other engines (it is closed before the engine stops).
    `demo_trained`: without `model_path`, serve the trained demo rather than random weights.
    `progress` hears each phase (building the demo, loading, starting); `cancelled` gives up
    building the demo; `bar`: the demo training's progress bar (on a terminal)."""
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    progress = progress if progress is not None else LoadProgress()
    checkpoint = await asyncio.to_thread(
        partial(
            resolve_checkpoint,
            trained=demo_trained,
            progress=progress,
            cancelled=cancelled,
            bar=bar,
        ),
        model_path,
        demo_dir,
        demo_preset,
    )
    progress.set("loading checkpoint")
    tokenizer = await asyncio.to_thread(Tokenizer.from_dir, checkpoint)
    engine = await asyncio.to_thread(
        partial(
            AsyncEngine.from_checkpoint,
            on_block_event=on_block_event,
            on_load_progress=_LoadReport(progress),
        ),
        checkpoint,
        config,
    )
    progress.set("starting engine")
    engine.start()
    stats = engine.stats()
    log.info(
        "local_engine_started",
        provider=name,
        checkpoint=str(checkpoint),
        kv_blocks=stats.num_total_blocks,
        block_size=engine.block_size,
        max_model_len=engine.max_model_len,
        tensor_parallel=config.tensor_parallel,
        expert_parallel=config.expert_parallel,
        data_parallel_attention=config.data_parallel_attention,
    )
    try:
        async with AsyncExitStack() as stack:
            placer = None
            if open_placer is not None:
                placer = await stack.enter_async_context(open_placer(engine))
            yield LocalProvider(
                name,
                engine,
                tokenizer,
                model_id,
                slots=config.max_num_seqs,
                placer=placer,
                checkpoint=checkpoint,
            )
    finally:
        await engine.stop()
        log.info("local_engine_stopped", provider=name)
