"""Prompt-token estimates for admission (reserve before the provider is called).

A provider that can count exactly (the local engine has the checkpoint's tokenizer) implements
`TokenCounter`. Otherwise the documented estimate is one token per 3 characters of text (byte-
level BPE tokenizers average 3.5-4.5 characters per English token and about 1 per CJK character,
so this errs high for English and is near for code) plus 4 tokens of framing per message.
"""

from __future__ import annotations

import json
from typing import Protocol

from providers.types import ChatRequest

CHARS_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 4


class TokenCounter(Protocol):
    def count_prompt_tokens(self, request: ChatRequest) -> int: ...


def estimate_prompt_tokens(request: ChatRequest) -> int:
    if request.prompt is not None:
        return len(request.prompt) // CHARS_PER_TOKEN + 1
    chars = 0
    for m in request.messages:
        chars += len(m.text) + len(m.reasoning_content or "")
        for call in m.tool_calls:
            chars += len(call.name) + len(call.arguments)
    for tool in request.tools:
        chars += len(tool.name) + len(tool.description or "")
        chars += len(json.dumps(tool.parameters)) if tool.parameters else 0
    return chars // CHARS_PER_TOKEN + TOKENS_PER_MESSAGE * len(request.messages) + 1


def count_prompt_tokens(provider: object, request: ChatRequest) -> int:
    """Exact when the provider is a `TokenCounter`, else the documented estimate. (An attribute
    check, not a runtime-checkable isinstance: this runs on every request.)"""
    counter = getattr(provider, "count_prompt_tokens", None)
    if counter is not None:
        return int(counter(request))
    return estimate_prompt_tokens(request)
