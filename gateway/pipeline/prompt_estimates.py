"""Prompt-token estimates for admission (reserve before the provider is called).

Exact where the serving provider prepared the prompt (the local engine tokenizes it once, off
the event loop, and the ids travel with the request). Otherwise the documented estimate is one
token per 3 characters of text (byte-level BPE tokenizers average 3.5-4.5 characters per
English token and about 1 per CJK character, so this errs high for English and is near for
code) plus 4 tokens of framing per message.
"""

from __future__ import annotations

import json

from providers.types import ChatRequest

CHARS_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 4


def estimate_prompt_tokens(request: ChatRequest) -> int:
    if request.prompt is not None:  # fill in the middle: the suffix is prompt too
        return (len(request.prompt) + len(request.suffix or "")) // CHARS_PER_TOKEN + 1
    chars = 0
    for m in request.messages:
        chars += len(m.text) + len(m.reasoning_content or "")
        for call in m.tool_calls:
            chars += len(call.name) + len(call.arguments)
    for tool in request.tools:
        chars += len(tool.name) + len(tool.description or "")
        chars += len(json.dumps(tool.parameters)) if tool.parameters else 0
    return chars // CHARS_PER_TOKEN + TOKENS_PER_MESSAGE * len(request.messages) + 1


def prompt_tokens(request: ChatRequest) -> int:
    """The prepared prompt's exact length, else the documented estimate."""
    if request.prepared is not None:
        return request.prepared.num_tokens
    return estimate_prompt_tokens(request)
