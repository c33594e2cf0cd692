"""What the local provider needs of an engine, wherever it runs (in-process `AsyncEngine`,
a peer's over `providers.local.remote_engine.RemoteEngine`, or worker 0's seen from another worker,
`providers.local.worker_engine.SharedEngine`), and of whoever picks one."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Protocol

from backend.engine.interface import EngineStats, RequestOutput
from backend.engine.request import FinishReason
from backend.engine.sampling_params import SamplingParams
from providers.types import EngineFit


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

    @property
    def block_size(self) -> int: ...

    @property
    def hash_seed(self) -> bytes:
        """The seed of its prefix-cache block hashes (`backend.engine.block_hash`)."""
        ...

    def stats(self) -> EngineStats: ...

    def queue_counts(self) -> tuple[int, int]:
        """(waiting, running) as `stats()` counts them, without building a snapshot: the
        router asks it per request."""
        ...

    def cached_prefix_blocks(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of the chain `hashes` its prefix cache holds now."""
        ...


class EnginePlacer(Protocol):
    def place(
        self,
        prompt_ids: Sequence[int],
        block_hashes: Sequence[bytes],
        on_fallback: Callable[[str], None],
    ) -> tuple[EngineClient, str]:
        """The engine to serve `prompt_ids` (whose reusable blocks hash to `block_hashes`) and
        the choice in words ("node=b; prefix=12/14; via=forward"); should a forward fall back to
        this node before anything was generated, `on_fallback` is told the new placement."""
        ...

    def fit(self, num_tokens: int, block_hashes: Sequence[bytes]) -> EngineFit:
        """Where `place` would put such a prompt now, and how much of it is cached there
        (nothing is marked: the router asks before the request is admitted)."""
        ...
