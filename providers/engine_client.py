"""What the local provider needs of an engine, wherever it runs (in-process `AsyncEngine`,
a peer's over `providers.remote_engine.RemoteEngine`, or worker 0's seen from another worker,
`providers.shared_engine.SharedEngine`), and of whoever picks one."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Protocol

from backend.engine.interface import EngineStats, RequestOutput
from backend.engine.request import FinishReason
from backend.engine.sampling_params import SamplingParams
from providers.types import RouteTrace


class EngineClient(Protocol):
    def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncGenerator[RequestOutput, None]: ...

    def finish(self, request_id: str, reason: FinishReason = "stop") -> None: ...


class ServedEngine(EngineClient, Protocol):
    """An engine a provider serves from: it generates, and says how big and how busy it is."""

    @property
    def max_model_len(self) -> int: ...

    @property
    def is_running(self) -> bool: ...

    def stats(self) -> EngineStats: ...


class EnginePlacer(Protocol):
    def place(self, prompt_ids: Sequence[int], trace: RouteTrace) -> EngineClient:
        """The engine to serve `prompt_ids`; the choice is explained in `trace.placement`."""
        ...
