"""`POST /v1/messages/count_tokens`: the prompt tokens a Messages request would take on the
first route of its model. Exact where the route's provider counts (the local engine: its
tokenizer, chat template and tools prompt, with the route's thinking switch); elsewhere the
estimate admission reserves (gateway/tokens.py), which errs high for English text.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gateway.access import Principal, require_model
from gateway.routing import Router
from gateway.tokens import count_prompt_tokens
from providers.types import ChatRequest


async def count_message_tokens(router: Router, principal: Principal, chat: ChatRequest) -> int:
    model = router.canonical(chat.model)
    route = router.resolve(model)[0]
    require_model(principal, model)
    request = replace(chat, model=route.model, thinking=route.thinking_for(chat.thinking))
    # Tokenizing a long conversation takes a while: off the event loop.
    return await asyncio.to_thread(count_prompt_tokens, route.provider, request)
