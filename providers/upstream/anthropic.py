"""An upstream that speaks the Anthropic Messages API (Anthropic; DeepSeek's and TaoToken's
Anthropic-compatible endpoints): `OpenAIUpstream`'s transport, timeouts, error mapping and model
listing, with the Messages wire format (providers/upstream/anthropic_wire.py), `x-api-key` and
`anthropic-version` headers. `base_url` ends before "/v1/messages", e.g.
"https://api.anthropic.com" or "https://api.deepseek.com/anthropic".
"""

from __future__ import annotations

from typing import Any

from plumbing.busy_wait import BusyWait
from providers.errors import InvalidRequest
from providers.types import ChatRequest
from providers.upstream.anthropic_wire import MessagesDecoder, build_messages_body
from providers.upstream.openai import OpenAIUpstream, UpstreamConfig
from providers.upstream.openai_wire import StreamDecoder

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicUpstream(OpenAIUpstream):
    def __init__(self, config: UpstreamConfig, *, busy: BusyWait | None = None) -> None:
        super().__init__(config, busy=busy)
        base = config.base_url.rstrip("/")
        self._chat_url = base + "/v1/messages"
        self._models_url = base + "/v1/models"

    @property
    def supports_fim(self) -> bool:
        """The Messages API has no fill in the middle."""
        return False

    def _auth_headers(self) -> dict[str, str]:
        key = self._config.api_key
        return {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": key} if key else {})}

    def _request(self, request: ChatRequest, stream: bool) -> tuple[str, dict[str, Any]]:
        if request.prompt is not None:
            raise InvalidRequest(
                f"Provider {self.name!r} speaks the Messages API: legacy completions (a raw "
                "prompt) are not served there.",
                provider=self.name,
                param="prompt",
            )
        return self._chat_url, build_messages_body(request, stream=stream)

    def _decoder(self) -> StreamDecoder:
        return MessagesDecoder(self.name)
