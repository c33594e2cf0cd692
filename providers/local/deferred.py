"""A local-engine provider that serves before its engine exists: the gateway listens at once
and loads (or trains) the engine behind it.

`DeferredLocalProvider` stands in the provider table from the start. Until a `LocalProvider`
is set on it (`set_local`), whatever needs the engine raises `EngineLoading` (503
`engine_loading` with Retry-After, naming what is under way: "training demo 45%", "loading
checkpoint"), so a model with an upstream route falls back to it, and `health()` is False
(readiness says "loading"). After `fail(reason)` it raises `UpstreamUnavailable` naming the
reason, and `engine_failure()` reports it. Once set, every call goes to the `LocalProvider`
with no wrapper on the hot path.

`LoadProgress` is what the loader reports and readiness reads: a phase and a fraction,
written by the loading thread and read by the event loop (a tuple swapped whole).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

from backend.engine.interface import EngineStats
from providers.base import ModelCard
from providers.errors import EngineLoading, UpstreamUnavailable
from providers.local.provider import LocalProvider
from providers.types import ChatRequest, EngineFit, Event, PreparedPrompt, ProviderLoad

T = TypeVar("T")

RETRY_AFTER_S = 10  # what a client asking during the load is told to wait


class LoadProgress:
    """What a loading engine is doing: `phase`, and how far (`fraction` 0..1, or None)."""

    def __init__(self, phase: str = "starting") -> None:
        self._state: tuple[str, float | None] = (phase, None)

    def set(self, phase: str, fraction: float | None = None) -> None:
        self._state = (phase, fraction)

    @property
    def phase(self) -> str:
        return self._state[0]

    @property
    def fraction(self) -> float | None:
        return self._state[1]

    def describe(self) -> str:
        """E.g. "training demo 45%", "loading checkpoint"."""
        phase, fraction = self._state
        return phase if fraction is None else f"{phase} {int(fraction * 100)}%"


class DeferredLocalProvider:
    """The local provider before, and then as, its engine serves (see the module)."""

    supports_fim = True  # as LocalProvider

    def __init__(self, name: str, progress: LoadProgress | None = None) -> None:
        self.name = name
        self.progress = progress if progress is not None else LoadProgress()
        self._local: LocalProvider | None = None
        self._failure: str | None = None

    @property
    def local(self) -> LocalProvider | None:
        """The serving provider, once the engine is up."""
        return self._local

    def set_local(self, local: LocalProvider) -> None:
        self._local = local

    def fail(self, reason: str) -> None:
        """The load failed: refuse with `reason` from now on."""
        self._failure = reason

    def loading(self) -> str | None:
        """What the load is doing ("training demo 45%"); None once served or failed."""
        if self._local is not None or self._failure is not None:
            return None
        return self.progress.describe()

    @property
    def context_length(self) -> int | None:
        return self._local.context_length if self._local is not None else None

    async def prepare(self, request: ChatRequest) -> PreparedPrompt:
        return await self._ready().prepare(request)

    async def prepare_with(
        self, request: ChatRequest, also: Callable[[ChatRequest], T]
    ) -> tuple[PreparedPrompt, T]:
        return await self._ready().prepare_with(request, also)

    def load(self) -> ProviderLoad | None:
        return self._local.load() if self._local is not None else None

    def fit(self, prompt: PreparedPrompt) -> EngineFit:
        return self._local.fit(prompt) if self._local is not None else EngineFit(0)

    def chat(self, request: ChatRequest) -> AsyncGenerator[Event, None]:
        local = self._local
        if local is None:
            return self._when_ready(request)
        return local.chat(request)  # no wrapper on the hot path

    async def models(self) -> list[ModelCard]:
        return await self._local.models() if self._local is not None else []

    async def health(self) -> bool:
        return self._local is not None and await self._local.health()

    def engine_stats(self) -> EngineStats | None:
        return self._local.engine_stats() if self._local is not None else None

    def engine_failure(self) -> dict[str, Any] | None:
        """Why the engine is down: its load failed, or it stopped on an error."""
        if self._failure is not None:
            return {"reason": self._failure, "ranks": {}}
        return self._local.engine_failure() if self._local is not None else None

    async def close(self) -> None:
        """Nothing to release: the engine belongs to whoever loads it."""

    def _ready(self) -> LocalProvider:
        if self._local is not None:
            return self._local
        if self._failure is not None:
            raise UpstreamUnavailable(
                f"The local engine '{self.name}' failed to load: {self._failure}",
                provider=self.name,
            )
        raise EngineLoading(
            f"The local engine '{self.name}' is not ready yet ({self.progress.describe()}); "
            f"retry in {RETRY_AFTER_S} s.",
            provider=self.name,
            retry_after=RETRY_AFTER_S,
        )

    async def _when_ready(self, request: ChatRequest) -> AsyncGenerator[Event, None]:
        """Raises on the first iteration unless the engine came up in the meantime."""
        async with contextlib.aclosing(self._ready().chat(request)) as events:
            async for event in events:
                yield event
