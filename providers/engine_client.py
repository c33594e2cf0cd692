"""What the local provider needs of an engine, wherever it runs (in-process `AsyncEngine`,
or a peer's over `providers.remote_engine.RemoteEngine`), and of whoever picks one."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Protocol

from backend.engine.llm_engine import RequestOutput
from backend.engine.request import FinishReason
from backend.engine.sampling_params import SamplingParams
from providers.types import EngineFit, RouteTrace


class EngineClient(Protocol):
    def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncGenerator[RequestOutput, None]: ...

    def finish(self, request_id: str, reason: FinishReason = "stop") -> None: ...


class EnginePlacer(Protocol):
    def place(
        self, prompt_ids: Sequence[int], block_hashes: Sequence[bytes], trace: RouteTrace
    ) -> EngineClient:
        """The engine to serve `prompt_ids` (whose reusable blocks hash to `block_hashes`);
        the choice is explained in `trace.placement`."""
        ...

    def fit(self, num_tokens: int, block_hashes: Sequence[bytes]) -> EngineFit:
        """Where `place` would put such a prompt now, and how much of it is cached there
        (nothing is marked: the router asks before the request is admitted)."""
        ...
