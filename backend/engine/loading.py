"""An `LLMEngine` over a checkpoint directory: the model loaded on one device, or started over
`tensor_parallel` ranks; the checkpoint's fingerprint seeds the prefix-cache block hashes and
its generation_config.json gives the sampling defaults."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from backend.engine.blocks import BlockEvent
from backend.engine.engine_config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.model.checkpoint import load_generation_config, load_model
from backend.model.fingerprint import checkpoint_fingerprint
from backend.model.model import DeepseekV3ForCausalLM


def load_engine(
    model_dir: str | Path,
    config: EngineConfig,
    *,
    on_block_event: Callable[[BlockEvent], None] | None = None,
    on_load_progress: Callable[[int, int], None] | None = None,
) -> LLMEngine:
    """Blocking (seconds to minutes): call it off the event loop. A failure after the model
    loaded closes it (and its worker ranks). `on_load_progress(done, total)`: the weights'
    tensors loaded so far, on one device (the ranks of a parallel engine load on their own)."""
    model: DeepseekV3ForCausalLM
    if config.tensor_parallel > 1:
        from backend.parallel.cluster import start_parallel_model

        model, _ = start_parallel_model(model_dir, config)
    else:
        model = load_model(
            model_dir,
            dtype=config.torch_dtype,
            device=config.resolved_device(),
            fp8_weights=config.fp8_weights,
            report=on_load_progress,
        )
    try:
        engine = LLMEngine(
            model,
            config,
            hash_seed=checkpoint_fingerprint(model_dir),
            generation_defaults=load_generation_config(model_dir),
            on_block_event=on_block_event,
        )
    except BaseException:
        model.close()
        raise
    return engine
