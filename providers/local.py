"""The local-engine provider: ChatRequest -> V3.1 prompt ids -> AsyncEngine -> Events.

Chat: messages and tools are rendered by the checkpoint's chat template (thinking off unless
the request turns it on, V3.1's default), sampling defaults come from generation_config.json,
and the output is detokenized and parsed into reasoning, content and tool calls (providers/
local_stream.py). Legacy completions (`request.prompt`): BOS + the raw prompt, no template, no
parsers. Stop strings are matched here on the content (not the reasoning); on a hit the engine
request is finished at once. A consumer that stops iterating (client gone) aborts the engine
request in a `finally`, which frees its KV blocks at the engine's next step.
Not enforced: tool_choice other than "none" (which drops the tools), and response_format.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from backend.engine.async_engine import (
    AsyncEngine,
    EngineClosed,
    EngineError,
    EngineOverloaded,
    EngineStats,
)
from backend.engine.sampling_params import SamplingParams
from backend.text.chat_template import ChatFormatError
from backend.text.tokenizer import Tokenizer
from providers.base import ModelCard
from providers.errors import InvalidRequest, Overloaded, UpstreamUnavailable
from providers.local_stream import TokenTranslator
from providers.types import ChatRequest, Event, Finish, FinishReason, Tool, Usage


@dataclass(frozen=True, slots=True)
class _Prompt:
    """A request's prompt ids and how its output is to be read."""

    ids: list[int]
    parse: bool  # chat: parse reasoning and tool calls; completion: plain text
    thinking: bool  # the prompt ends in <think>: output starts as reasoning
    tools_enabled: bool


def _tool_dict(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters or {}}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


class LocalProvider:
    """The Provider (and exact TokenCounter) for an in-process AsyncEngine.

    `model_id`: the one model this provider lists; a request's model name is not checked (routes
    name the provider-side model). Sampling values the request leaves unset are filled by the
    engine from the checkpoint's generation_config.json.
    """

    def __init__(
        self,
        name: str,
        engine: AsyncEngine,
        tokenizer: Tokenizer,
        model_id: str,
    ) -> None:
        self.name = name
        self._engine = engine
        self._tokenizer = tokenizer
        self._model_id = model_id

    def count_prompt_tokens(self, request: ChatRequest) -> int:
        """Exact prompt length as `chat` will encode it; 0 for a request `chat` will refuse
        (it fails there with a 400 before anything is generated)."""
        try:
            return len(self._encode(request).ids)
        except InvalidRequest:
            return 0

    async def chat(self, request: ChatRequest) -> AsyncGenerator[Event, None]:
        prompt = await asyncio.to_thread(self._encode, request)  # long prompts take a while
        params = self._params(request)
        translator = TokenTranslator(
            self._tokenizer,
            prompt.ids,
            parse=prompt.parse,
            thinking=prompt.thinking,
            tools_enabled=prompt.tools_enabled,
            stops=params.stop,
            logprobs=params.logprobs,
        )
        request_id = f"{request.request_id or 'local'}-{uuid.uuid4().hex[:12]}"
        outputs = self._engine.generate(request_id, prompt.ids, params)
        num_cached = 0
        engine_reason: str | None = None
        try:
            async for output in outputs:
                num_cached = output.num_cached_tokens
                for event in translator.push(output.new_token_ids, output.logprobs):
                    yield event
                if translator.stopped:
                    self._engine.finish(request_id, "stop")
                    engine_reason = "stop"
                    break
                if output.finished:
                    engine_reason = output.finish_reason
                    break
        except EngineOverloaded as exc:
            raise Overloaded(
                f"The local engine is at capacity: {exc}",
                provider=self.name,
                retry_after=max(1, math.ceil(exc.retry_after_s)),
            ) from None
        except ValueError as exc:  # PromptTooLong, or token ids the model cannot read
            param = "messages" if prompt.parse else "prompt"
            raise InvalidRequest(str(exc), provider=self.name, param=param) from None
        except (EngineClosed, EngineError) as exc:
            raise UpstreamUnavailable(str(exc), provider=self.name) from None
        finally:
            await outputs.aclose()  # aborts the engine request unless it finished
        if engine_reason not in ("stop", "length"):
            raise UpstreamUnavailable("the local engine aborted the request", provider=self.name)
        for event in translator.finish():
            yield event
        yield Usage(
            prompt_tokens=len(prompt.ids),
            completion_tokens=translator.num_tokens,
            reasoning_tokens=translator.num_reasoning_tokens,
            cached_prompt_tokens=num_cached,
        )
        yield Finish(self._finish_reason(engine_reason, translator), translator.stop_sequence)

    async def models(self) -> list[ModelCard]:
        return [ModelCard(id=self._model_id, owned_by=self.name)]

    async def health(self) -> bool:
        """Whether the engine's thread is alive and taking requests."""
        return self._engine.is_running

    def engine_stats(self) -> EngineStats:
        """The engine's latest step snapshot (for metrics)."""
        return self._engine.stats()

    async def close(self) -> None:
        """Nothing to release: the engine belongs to whoever opened it (open_local_provider)."""

    def _encode(self, request: ChatRequest) -> _Prompt:
        tokenizer = self._tokenizer
        if request.prompt is not None:
            ids = tokenizer.encode(request.prompt, add_bos=True)
            return _Prompt(ids, parse=False, thinking=False, tools_enabled=False)
        tools = [_tool_dict(t) for t in request.tools] if request.tool_choice != "none" else []
        try:
            ids = tokenizer.encode_chat(
                [m.openai_dict() for m in request.messages],
                thinking=bool(request.thinking),
                tools=tools or None,
            )
        except ChatFormatError as exc:
            raise InvalidRequest(str(exc), provider=self.name, param="messages") from None
        return _Prompt(
            ids,
            parse=True,
            thinking=tokenizer.prompt_opens_reasoning(ids),
            tools_enabled=bool(tools),
        )

    def _params(self, request: ChatRequest) -> SamplingParams:
        s = request.sampling
        try:
            params = SamplingParams(
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k or 0,
                min_p=s.min_p or 0.0,
                seed=s.seed,
                presence_penalty=s.presence_penalty or 0.0,
                frequency_penalty=s.frequency_penalty or 0.0,
                repetition_penalty=s.repetition_penalty or 1.0,
                stop=s.stop,
                max_tokens=s.max_tokens,
                logprobs=s.logprobs,
                top_logprobs=s.top_logprobs or 0,
            )
        except ValueError as exc:
            raise InvalidRequest(str(exc), provider=self.name) from None
        return params

    @staticmethod
    def _finish_reason(engine_reason: str, translator: TokenTranslator) -> FinishReason:
        if engine_reason == "length":
            return "length"
        return "tool_calls" if translator.num_tool_calls else "stop"
