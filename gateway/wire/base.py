"""What the pipeline needs of a front-end protocol (chat, completions, Responses, ...): a stream
encoder of Events, an aggregator into one JSON body, and the names that go with them."""

from __future__ import annotations

from typing import Any, Protocol

from gateway.errors import GatewayError
from providers.types import Event


class StreamEncoder(Protocol):
    def start(self) -> bytes: ...
    def keepalive(self) -> bytes:
        """A frame for a long silence: the client's idle timer restarts, nothing else changes."""
        ...

    def encode(self, event: Event) -> bytes | None: ...
    def close(self) -> list[bytes]: ...
    def fail(self, error: GatewayError) -> bytes:
        """The frame that reports a failure after the stream started (instead of `close`)."""
        ...


class Aggregator(Protocol):
    def add(self, event: Event) -> None: ...
    def body(self, completion_id: str, model: str) -> dict[str, Any]: ...


class Wire(Protocol):
    """How one front-end protocol shapes its answer."""

    endpoint: str
    id_prefix: str

    def stream_encoder(
        self, completion_id: str, model: str, prompt_tokens: int = 0
    ) -> StreamEncoder:
        """`prompt_tokens`: the admitted prompt length, for protocols that report input usage
        when the stream opens (Anthropic's `message_start`)."""
        ...

    def aggregator(self) -> Aggregator: ...
