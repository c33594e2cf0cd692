"""Encode provider Events as legacy `/v1/completions` SSE chunks or one JSON body.

Reasoning and tool calls have no place in this API: only text is emitted. `echo` prepends the
prompt to the first text.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.errors import GatewayError
from gateway.wire.chat_response import KEEPALIVE, sse, stream_tail, usage_json
from providers.types import Event, Finish, FinishReason, TextDelta, Usage


class CompletionStreamEncoder:
    def __init__(self, completion_id: str, model: str, include_usage: bool, echo: str = ""):
        self._head = {
            "id": completion_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        self._include_usage = include_usage
        self._echo = echo
        self._finish: FinishReason | None = None
        self._usage: Usage | None = None

    @property
    def usage(self) -> Usage | None:
        return self._usage

    def _chunk(self, text: str, finish: str | None = None) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return sse({**self._head, "choices": [choice]})

    def start(self) -> bytes:
        text, self._echo = self._echo, ""
        return self._chunk(text)

    def keepalive(self) -> bytes:
        return KEEPALIVE

    def encode(self, event: Event) -> bytes | None:
        if isinstance(event, TextDelta):
            return self._chunk(event.text)
        if isinstance(event, Usage):
            self._usage = event
        elif isinstance(event, Finish):
            self._finish = event.reason
        return None

    def close(self, finish: FinishReason | None = None) -> list[bytes]:
        usage = (self._usage or Usage()) if self._include_usage else None
        return [self._chunk("", finish=finish or self._finish or "stop")] + stream_tail(
            self._head, usage
        )

    def fail(self, error: GatewayError) -> bytes:
        """A failure after the stream started: `data: {"error": {...}}`, and no [DONE]."""
        return sse(error.body())


class CompletionAggregator:
    def __init__(self, echo: str = "") -> None:
        self.text: list[str] = [echo] if echo else []
        self.finish: FinishReason | None = None
        self.usage = Usage()

    def add(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.text.append(event.text)
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Finish):
            self.finish = event.reason

    def body(self, completion_id: str, model: str) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": "".join(self.text),
                    "logprobs": None,
                    "finish_reason": self.finish or "stop",
                }
            ],
            "usage": usage_json(self.usage),
        }


class CompletionWire:
    """The legacy completions answer shape, for the pipeline."""

    endpoint = "completions"
    id_prefix = "cmpl-"

    def __init__(self, include_usage: bool, echo: str = "") -> None:
        self.include_usage = include_usage
        self.echo = echo

    def stream_encoder(
        self, completion_id: str, model: str, prompt_tokens: int = 0
    ) -> CompletionStreamEncoder:
        return CompletionStreamEncoder(completion_id, model, self.include_usage, self.echo)

    def aggregator(self) -> CompletionAggregator:
        return CompletionAggregator(self.echo)
