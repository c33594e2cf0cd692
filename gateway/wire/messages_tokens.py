"""`POST /v1/messages/count_tokens`: the prompt tokens a Messages request would take on the
first route of its model. Exact where the route's provider counts (the local engine: its
tokenizer, chat template and tools prompt, with the route's thinking switch); elsewhere the
estimate admission reserves (gateway/pipeline/prompt_estimates.py), which errs high for English
text.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.access.contract import Principal, require_model
from gateway.errors import provider_error_to_gateway
from gateway.pipeline.prompt_estimates import estimate_prompt_tokens
from gateway.routing import Router
from providers import errors as perr
from providers.types import ChatRequest


async def count_message_tokens(router: Router, principal: Principal, chat: ChatRequest) -> int:
    model = router.canonical(chat.model)
    route = router.resolve(model)[0]
    require_model(principal, model)
    request = replace(chat, model=route.model, thinking=route.thinking_for(chat.thinking))
    prepare = getattr(route.provider, "prepare", None)
    if prepare is None:
        return estimate_prompt_tokens(request)
    try:  # the provider tokenizes off the event loop
        prepared = await prepare(request)
    except perr.EngineLoading:  # no tokenizer yet: the estimate, as for upstreams
        return estimate_prompt_tokens(request)
    except perr.ProviderError as exc:
        raise provider_error_to_gateway(exc) from None
    return int(prepared.num_tokens)
