"""The local-engine provider: ChatRequest -> V3.1 prompt ids -> engine -> Events.

Chat: messages and tools are rendered by the checkpoint's chat template (thinking off unless
the request turns it on, V3.1's default), sampling defaults come from generation_config.json,
and the output is detokenized and parsed into reasoning, content and tool calls (providers/
local_stream.py). Legacy completions (`request.prompt`): BOS + the raw prompt, no template, no
parsers. Fill in the middle (`request.suffix` set): DeepSeek's FIM layout
(`Tokenizer.encode_fim`), never thinking, answered like a legacy completion. Stop strings are
matched here on the content (not the reasoning); on a hit the engine request is finished at once.
A consumer that stops iterating (client gone) aborts the engine request in a `finally`, which
frees its KV blocks at the engine's next step. The engine is the in-process `AsyncEngine`, or
worker 0's reached over a socket (`providers.local.worker_engine`): the provider tokenizes, parses
and counts here either way.
Structured output: `response_format` (JSON mode, JSON Schema), `tool_choice` required or
named, and `strict` tools are enforced by the engine's grammar while sampling
(backend/text/structured.py says what each asks and how `strict: false` is treated); the
grammar starts after the reasoning. What it cannot enforce is an InvalidRequest naming the part.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from backend.engine.block_hash import extend_chain, root_hash
from backend.engine.interface import (
    EngineClosed,
    EngineDown,
    EngineError,
    EngineOverloaded,
    EngineStats,
)
from backend.engine.sampling_params import SamplingParams
from backend.text.chat_template import ChatFormatError, UnsupportedContent
from backend.text.structured import ConstraintError, build_constraint, grammar_starts_after
from backend.text.tokenizer import Tokenizer
from providers.base import ModelCard
from providers.errors import InvalidRequest, Overloaded, UpstreamUnavailable
from providers.local.engine_client import EngineClient, EnginePlacer, ServedEngine
from providers.local.stream import TokenTranslator
from providers.types import (
    ChatRequest,
    EngineFit,
    Event,
    Finish,
    FinishReason,
    Placed,
    PreparedPrompt,
    ProviderLoad,
    Tool,
    Usage,
)

T = TypeVar("T")


def _tool_dict(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters or {}}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


class LocalProvider:
    """The Provider for a V3.1 engine (`ServedEngine`); it prepares prompts (exact token counts)
    and reports its load. Its `context_length` bounds what a request without max_tokens may
    produce (gateway/pipeline/output_limits.py).

    `model_id`: the one model this provider lists; a request's model name is not checked (routes
    name the provider-side model). Sampling values the request leaves unset are filled by the
    engine from the checkpoint's generation_config.json. `slots`: the engine's max_num_seqs
    (requests beyond it wait). `placer`: picks the engine per prompt (this one, or a cluster
    peer's; gateway/cluster/) and explains the choice. `checkpoint`: the directory the engine
    and the tokenizer were loaded from (what worker 0 tells the other workers).
    """

    def __init__(
        self,
        name: str,
        engine: ServedEngine,
        tokenizer: Tokenizer,
        model_id: str,
        *,
        slots: int,
        placer: EnginePlacer | None = None,
        checkpoint: Path | None = None,
    ) -> None:
        self.name = name
        self.slots = slots
        self.model_id = model_id
        self.checkpoint = checkpoint
        self._engine = engine
        self._placer = placer
        self._tokenizer = tokenizer
        self._block_size = engine.block_size
        self._root = root_hash(engine.hash_seed, engine.block_size)

    # Fills in the middle (`ChatRequest.suffix`) itself; the router skips providers without it.
    supports_fim = True

    @property
    def engine(self) -> ServedEngine:
        return self._engine

    @property
    def context_length(self) -> int:
        """The most tokens of prompt and output together that one request may hold."""
        return self._engine.max_model_len

    async def prepare(self, request: ChatRequest) -> PreparedPrompt:
        """The request's prompt ids, tokenized off the event loop (a 60K-token prompt takes
        about 100 ms). Raises InvalidRequest for a request `chat` would refuse."""
        return await asyncio.to_thread(self._encode, request)

    async def prepare_with(
        self, request: ChatRequest, also: Callable[[ChatRequest], T]
    ) -> tuple[PreparedPrompt, T]:
        """`prepare`, and `also(request)` in the same worker thread: the router's own reading
        of the request (the judge's ask) off the event loop without a second thread hop."""
        return await asyncio.to_thread(lambda: (self._encode(request), also(request)))

    def load(self) -> ProviderLoad:
        waiting, running = self._engine.queue_counts()
        return ProviderLoad(
            waiting=waiting,
            running=running,
            slots=self.slots,
            max_context=self._engine.max_model_len,
        )

    def fit(self, prompt: PreparedPrompt) -> EngineFit:
        """Where `prompt` would run now and how much of it is cached there, by dict lookups of
        its block hashes (no I/O): the router's local-or-upstream choice asks it."""
        if self._placer is not None:
            return self._placer.fit(prompt.num_tokens, prompt.block_hashes)
        return EngineFit(self._engine.cached_prefix_blocks(prompt.block_hashes) * self._block_size)

    async def chat(self, request: ChatRequest) -> AsyncGenerator[Event, None]:
        prompt = request.prepared
        if prompt is None or prompt.owner != self.name:
            prompt = await self.prepare(request)
        prompt = self._with_thinking(prompt, bool(request.thinking))
        params = self._params(request, prompt)
        translator = TokenTranslator(
            self._tokenizer,
            prompt.ids,
            parse=prompt.parse,
            thinking=prompt.opens_reasoning,
            tools_enabled=prompt.tools_enabled,
            stops=params.stop,
            logprobs=params.logprobs,
        )
        request_id = f"{request.request_id or 'local'}-{uuid.uuid4().hex[:12]}"
        engine: EngineClient = self._engine
        fell_back: list[str] = []  # a forward's placement once it fell back to this node
        if self._placer is not None:
            engine, placement = self._placer.place(
                prompt.ids, prompt.block_hashes, fell_back.append
            )
            yield Placed(placement)
        outputs = engine.generate(request_id, prompt.ids, params)
        num_cached = 0
        engine_reason: str | None = None
        try:
            async for output in outputs:
                if fell_back:  # before the first output: nothing was generated elsewhere
                    yield Placed(fell_back.pop())
                num_cached = output.num_cached_tokens
                for event in translator.push(output.new_token_ids, output.logprobs):
                    yield event
                if translator.stopped:
                    engine.finish(request_id, "stop")
                    engine_reason = "stop"
                    break
                if output.finished:
                    engine_reason = output.finish_reason
                    break
        except ConstraintError as exc:  # the engine could not compile the output's grammar
            raise InvalidRequest(str(exc), provider=self.name, param=exc.param) from None
        except EngineOverloaded as exc:
            raise Overloaded(
                "The local engine is at capacity; try again shortly.",
                provider=self.name,
                retry_after=max(1, math.ceil(exc.retry_after_s)),
                detail=str(exc),
            ) from None
        except ValueError as exc:  # PromptTooLong, or token ids the model cannot read
            param = "messages" if prompt.parse else "prompt"
            raise InvalidRequest(str(exc), provider=self.name, param=param) from None
        except EngineClosed as exc:
            raise UpstreamUnavailable(
                "The local engine is shutting down.", provider=self.name, detail=str(exc)
            ) from None
        except EngineError as exc:
            raise UpstreamUnavailable(
                "The local engine failed while answering.",
                provider=self.name,
                detail=f"{exc}: {exc.__cause__!r}",
            ) from None
        finally:
            await outputs.aclose()  # aborts the engine request unless it finished
        if engine_reason not in ("stop", "length"):
            raise UpstreamUnavailable(
                "The local engine stopped the answer before the end.",
                provider=self.name,
                detail=f"engine finish reason {engine_reason!r}",
            )
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
        return [ModelCard(id=self.model_id, owned_by=self.name)]

    async def health(self) -> bool:
        """Whether the engine's thread is alive and taking requests."""
        return self._engine.is_running

    def engine_failure(self) -> dict[str, Any] | None:
        """Why the in-process engine stopped: its error (``reason``) and, for the parallel
        engine, the ranks at fault (``ranks``: rank -> "exited with code -9" or "stopped
        responding"); None while it runs, after a clean stop, or when it runs elsewhere."""
        # Only an in-process engine (`AsyncEngine`) has a failure of its own to tell.
        failure: Exception | None = getattr(self._engine, "failure", None)
        if failure is None:
            return None
        ranks = failure.ranks if isinstance(failure, EngineDown) else {}
        return {"reason": str(failure), "ranks": {str(r): cause for r, cause in ranks.items()}}

    def engine_stats(self) -> EngineStats:
        """The engine's latest step snapshot (for metrics)."""
        return self._engine.stats()

    async def close(self) -> None:
        """Nothing to release: the engine belongs to whoever opened it (load_local_provider)."""

    def _encode(self, request: ChatRequest) -> PreparedPrompt:
        tokenizer = self._tokenizer
        thinking = bool(request.thinking)
        if request.prompt is not None and request.suffix is not None:
            ids = tokenizer.encode_fim(request.prompt, request.suffix)
            return PreparedPrompt(
                self.name, ids, False, False, False, False, self._block_chain(ids)
            )
        if request.prompt is not None:
            ids = tokenizer.encode(request.prompt, add_bos=True)
            return PreparedPrompt(
                self.name, ids, thinking, False, False, False, self._block_chain(ids)
            )
        tools = [_tool_dict(t) for t in request.tools] if request.tool_choice != "none" else []
        try:
            ids = tokenizer.encode_chat(
                [m.openai_dict() for m in request.messages],
                thinking=thinking,
                tools=tools or None,
            )
        except UnsupportedContent:  # said in no one protocol's terms: any client may meet it
            raise InvalidRequest(
                f"Provider '{self.name}' reads text only: images, audio and files cannot be "
                "sent to it.",
                provider=self.name,
            ) from None
        except ChatFormatError as exc:
            raise InvalidRequest(str(exc), provider=self.name, param="messages") from None
        opens = tokenizer.prompt_opens_reasoning(ids)
        return PreparedPrompt(
            self.name, ids, thinking, True, opens, bool(tools), self._block_chain(ids)
        )

    def _block_chain(self, ids: list[int]) -> tuple[bytes, ...]:
        """Hashes of the blocks of `ids` the engine may reuse: full ones, not the last token's."""
        size = self._block_size
        reusable = max(0, (len(ids) - 1) // size)
        hashes: list[bytes] = []
        extend_chain(hashes, self._root, ids[: reusable * size], size)
        return tuple(hashes)

    def _with_thinking(self, prompt: PreparedPrompt, thinking: bool) -> PreparedPrompt:
        """The prepared prompt with the other thinking switch, without tokenizing again: V3.1's
        template differs between the two only in the generation prompt's last token (`<think>`
        or `</think>`), and not at all after tool results (no generation prompt)."""
        if prompt.thinking == thinking or not prompt.parse:
            return prompt
        special = self._tokenizer.special
        ids = prompt.ids
        if ids and ids[-1] in (special.think, special.think_end):
            ids = [*ids[:-1], special.think if thinking else special.think_end]
        opens = self._tokenizer.prompt_opens_reasoning(ids)
        return replace(prompt, ids=ids, thinking=thinking, opens_reasoning=opens)

    def _params(self, request: ChatRequest, prompt: PreparedPrompt) -> SamplingParams:
        s = request.sampling
        budget = s.max_reasoning_tokens if prompt.opens_reasoning else None
        think_end = None if budget is None else self._tokenizer.special.think_end
        grammar, after = self._grammar(request, prompt)
        try:
            params = SamplingParams(
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=max(s.top_k or 0, 0),  # the API's -1 (vLLM's "off") is the engine's 0
                min_p=s.min_p or 0.0,
                seed=None if s.seed is None else s.seed % 2**64,  # the API's seeds are signed
                presence_penalty=s.presence_penalty or 0.0,
                frequency_penalty=s.frequency_penalty or 0.0,
                repetition_penalty=s.repetition_penalty or 1.0,
                stop=s.stop,
                max_tokens=s.max_tokens,
                logprobs=s.logprobs,
                top_logprobs=s.top_logprobs or 0,
                max_reasoning_tokens=budget,
                reasoning_end_token_id=think_end,
                grammar=grammar,
                grammar_after=after,
            )
        except ValueError as exc:
            raise InvalidRequest(str(exc), provider=self.name) from None
        return params

    def _grammar(
        self, request: ChatRequest, prompt: PreparedPrompt
    ) -> tuple[str | None, tuple[int, ...]]:
        """The output's constraint (text for SamplingParams.grammar) and the tokens it waits for;
        a chat request only (a legacy completion takes no format)."""
        if not prompt.parse:
            return None, ()
        tools = [(t.name, t.parameters, t.strict) for t in request.tools]
        try:
            constraint = build_constraint(
                request.response_format, tools, request.tool_choice, request.parallel_tool_calls
            )
        except ConstraintError as exc:
            raise InvalidRequest(str(exc), provider=self.name, param=exc.param) from None
        if constraint is None:
            return None, ()
        special = self._tokenizer.special
        return constraint.text, grammar_starts_after(constraint, special, prompt.opens_reasoning)

    @staticmethod
    def _finish_reason(engine_reason: str, translator: TokenTranslator) -> FinishReason:
        if engine_reason == "length":
            return "length"
        return "tool_calls" if translator.num_tool_calls else "stop"
