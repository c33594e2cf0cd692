"""The Provider protocol: one producer of Events per configured provider."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol, runtime_checkable

from plumbing.record import record
from providers.types import ChatRequest, Event


@record
class ModelCard:
    id: str
    owned_by: str
    created: int = 0


@runtime_checkable
class Provider(Protocol):
    """`chat` yields Events in order and ends after a `Finish` (a `Usage` may come before or
    after it). It raises `providers.errors.ProviderError` subclasses for failures; raising before
    the first event lets the router fall back to the next route. Cancelling the iterator (the
    client went away) must release every resource at once (upstream connection, engine blocks).
    A provider that fills in the middle (serves `ChatRequest.suffix`) says so with a true
    `supports_fim` attribute; the router skips the others for such requests.
    """

    name: str

    def chat(self, request: ChatRequest) -> AsyncGenerator[Event, None]: ...

    async def models(self) -> list[ModelCard]: ...

    async def health(self) -> bool: ...

    async def close(self) -> None: ...
