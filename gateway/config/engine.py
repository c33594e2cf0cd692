"""The embedded engine's settings, `[engine]`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from backend.engine.engine_config import EngineConfig
from gateway.config.frozen import FROZEN


class EngineSettings(BaseModel):
    """The embedded engine (providers of kind "local"): where its checkpoint comes from, and its
    knobs, written flat under `[engine]` and validated into `EngineConfig`, whose defaults and
    checks are the only ones (`cache_memory_mb` is accepted for `cache_memory_bytes`)."""

    model_config = FROZEN
    model_path: Path | None = Field(
        default=None,
        description="A checkpoint directory (config.json, safetensors, tokenizer). Unset: the "
        "demo checkpoint under `demo_dir`, built on first start.",
    )
    demo_dir: Path = Field(
        default=Path(".data/demo-checkpoint"),
        description="Where the demo checkpoint (random weights, the real architecture and "
        "tokenizer) is built and reused when `model_path` is unset.",
    )
    demo_preset: Literal["tiny", "small"] = Field(
        default="tiny",
        description='Without model_path: the demo model\'s size, "tiny" (2,048-token context; '
        'what the trained demo is trained in minutes) or "small" (about 190M parameters, '
        "16,384-token context; six times the training cost).",
    )
    demo_weights: Literal["trained", "random"] = Field(
        default="trained",
        description='Without model_path: "trained" serves the demo model briefly trained on the '
        "standard library's Python source (plain and fill-in-the-middle; built once, by one "
        "process per data directory, while the gateway already listens and /readyz shows how "
        "far it is: 2.5 to 8 minutes on two cores for the tiny preset, depending on the "
        "machine's load): a demo of the architecture whose answers are Python-looking tokens "
        'that repeat, not useful text; "random" the untrained one (built in seconds; its '
        "answers are random tokens).",
    )
    config: EngineConfig = Field(
        default_factory=EngineConfig,
        description="The engine's knobs, written flat under `[engine]`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _knobs_into_config(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "config" in data:
            return data
        own = {
            name: data[name]
            for name in ("model_path", "demo_dir", "demo_preset", "demo_weights")
            if name in data
        }
        knobs = {name: value for name, value in data.items() if name not in own}
        if "cache_memory_mb" in knobs:
            knobs["cache_memory_bytes"] = int(knobs.pop("cache_memory_mb")) << 20
        unknown = set(knobs) - {field.name for field in dataclasses.fields(EngineConfig)}
        if unknown:
            raise ValueError(f"unknown engine settings: {', '.join(sorted(unknown))}")
        return {**own, "config": knobs}
