"""The OpenAI chat wire format on the upstream side: ChatRequest -> JSON body, chunks -> Events.

Request mapping (`build_body`):
- `extra` (fields the gateway chose to pass through) first; every mapped field below wins over it.
- Messages keep their content (text or parts), name, tool_calls and tool_call_id; role
  "developer" is sent as "system" (accepted by every OpenAI-compatible server, unlike
  "developer"). Earlier `reasoning_content` is sent only with `send_reasoning_history`.
- A fill-in-the-middle request (`suffix` set) is a legacy completions body with `suffix`, and no
  thinking fields (neither OpenAI's nor DeepSeek's FIM endpoint thinks).
- Sampling fields are sent only when set; `max_tokens` is sent as `max_completion_tokens` to
  "reasoning_effort" (OpenAI) upstreams. A `prompt` request is a legacy completions body.
- `thinking` per style: deepseek -> `thinking: {"type": "enabled"|"disabled"}`;
  chat_template_kwargs -> `chat_template_kwargs.thinking` (vLLM, SGLang); reasoning_effort ->
  "medium" when on (a client's own effort in `extra` is kept), removed when off; none -> nothing.
  A reasoning budget (`sampling.max_reasoning_tokens`) reaches only reasoning_effort upstreams,
  as the nearest effort at or below it (low up to 2,048 tokens, medium up to 16,384, else high);
  the other styles take no budget, so none is sent.

Response mapping (`ChunkDecoder`): reasoning from `reasoning_content`, `reasoning` or an inline
leading `<think>...</think>` in content; tool call fragments with id and name on the first
fragment of each index (an id is made up when the upstream sends none); one `Finish` (flushed
after any held-back text; "stop" becomes "tool_calls" when calls were made); the last usage seen.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from backend.text.think_splitter import ThinkSplitter
from providers.errors import UpstreamUnavailable
from providers.types import (
    ChatRequest,
    Event,
    Finish,
    FinishReason,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    token_count,
)

ThinkingStyle = Literal["deepseek", "chat_template_kwargs", "reasoning_effort", "none"]
# How an upstream takes fill-in-the-middle requests: `suffix` on its /completions (OpenAI
# style), the same body on DeepSeek's /beta/completions, or not at all.
FimStyle = Literal["suffix", "deepseek_beta", "none"]

_OPTIONAL_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
    "insufficient_system_resource": "length",  # DeepSeek: output cut short by the server
}


def build_body(
    request: ChatRequest,
    *,
    thinking_style: ThinkingStyle,
    send_reasoning_history: bool,
    stream: bool,
) -> dict[str, Any]:
    """The upstream JSON body for `request` (chat, or legacy completions when `prompt` is set)."""
    body: dict[str, Any] = dict(request.extra)
    body["model"] = request.model
    sampling = request.sampling
    if request.prompt is not None:
        body["prompt"] = request.prompt
        if request.suffix is not None:
            body["suffix"] = request.suffix
        if sampling.logprobs:
            body["logprobs"] = sampling.top_logprobs or 0
    else:
        body["messages"] = [_message(m, send_reasoning_history) for m in request.messages]
        if sampling.logprobs:
            body["logprobs"] = True
            if sampling.top_logprobs is not None:
                body["top_logprobs"] = sampling.top_logprobs
    if sampling.max_tokens is not None:
        key = "max_completion_tokens" if thinking_style == "reasoning_effort" else "max_tokens"
        body[key] = sampling.max_tokens
    for name in _OPTIONAL_SAMPLING:
        value = getattr(sampling, name)
        if value is not None:
            body[name] = value
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if request.tools:
        body["tools"] = [
            _tool(t.name, t.description, t.parameters, t.strict) for t in request.tools
        ]
    if request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    if request.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.response_format is not None:
        body["response_format"] = request.response_format
    if request.user is not None:
        body["user"] = request.user
    if request.suffix is None:
        _set_thinking(body, request.thinking, thinking_style, request.sampling.max_reasoning_tokens)
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    else:
        body.pop("stream_options", None)
    return body


def _message(message: Message, send_reasoning: bool) -> dict[str, Any]:
    out = message.openai_dict()
    if message.role == "developer":
        out["role"] = "system"
    if message.content is None and not message.tool_calls:
        out["content"] = ""
    if send_reasoning and message.reasoning_content and message.role == "assistant":
        out["reasoning_content"] = message.reasoning_content
    return out


def _tool(
    name: str, description: str | None, parameters: dict[str, Any] | None, strict: bool
) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    if strict:  # the client's ask, passed through for the upstream to enforce
        function["strict"] = True
    return {"type": "function", "function": function}


_EFFORTS = ("minimal", "low", "medium", "high")


def _effort_for(budget: int) -> str:
    return "low" if budget <= 2048 else "medium" if budget <= 16384 else "high"


def _set_thinking(
    body: dict[str, Any], thinking: bool | None, style: ThinkingStyle, budget: int | None
) -> None:
    if thinking is None or style == "none":
        return
    if style == "deepseek":
        body["thinking"] = {"type": "enabled" if thinking else "disabled"}
    elif style == "chat_template_kwargs":
        kwargs = body.get("chat_template_kwargs")
        body["chat_template_kwargs"] = {
            **(kwargs if isinstance(kwargs, dict) else {}),
            "thinking": thinking,
        }
    elif thinking:
        effort = body.setdefault("reasoning_effort", "medium")
        if budget is not None and effort in _EFFORTS:
            capped = _effort_for(budget)
            body["reasoning_effort"] = min(effort, capped, key=_EFFORTS.index)
    else:
        body.pop("reasoning_effort", None)


def parse_usage(usage: dict[str, Any]) -> Usage:
    """OpenAI usage, with cached prompt tokens from OpenAI's or DeepSeek's field. A count that
    is not a token count (`token_count`) is a ValueError."""
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    cached = prompt_details.get("cached_tokens") or usage.get("prompt_cache_hit_tokens")
    return Usage(
        prompt_tokens=token_count(usage.get("prompt_tokens")),
        completion_tokens=token_count(usage.get("completion_tokens")),
        reasoning_tokens=token_count(completion_details.get("reasoning_tokens")),
        cached_prompt_tokens=token_count(cached),
    )


def error_message(payload: Any) -> str:
    """The human message of an upstream error body (`{"error": {...}}` and common variants)."""
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, dict):
            inner = inner.get("message") or inner.get("detail") or inner
        if isinstance(inner, str):
            return inner
    return json.dumps(payload)[:500]


class ChunkDecoder:
    """Turns one response's chunks (parsed JSON objects) into Events, appended to a list.

    Feed every chunk with `feed`, then call `end` once. A full (non-streaming) response is one
    chunk whose choice has `message` instead of `delta`. A chunk carrying `error` raises
    `UpstreamUnavailable`.
    """

    __slots__ = ("provider", "finished", "usage", "_splitter", "_calls")

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.finished = False
        self.usage: Usage | None = None
        # Until content starts, it may open with <think>; afterwards content passes straight.
        self._splitter: ThinkSplitter | None = ThinkSplitter()
        self._calls: set[int] = set()

    def feed(self, chunk: dict[str, Any], out: list[Event]) -> None:
        if chunk.get("error"):
            message = error_message(chunk)
            raise UpstreamUnavailable(
                f"Provider '{self.provider}' reported an error while answering: {message}",
                provider=self.provider,
            )
        choices = chunk.get("choices")
        if choices:
            choice = choices[0]
            delta = choice.get("delta") or choice.get("message")
            if delta:
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    out.append(ReasoningDelta(_text(reasoning)))
                content = delta.get("content")
                if content:
                    self._content(_text(content), choice.get("logprobs"), out)
                tool_calls = delta.get("tool_calls")
                if tool_calls:
                    self._tool_calls(tool_calls, out)
            elif choice.get("text"):
                logprobs = _legacy_logprobs(choice.get("logprobs"))
                self._content(_text(choice["text"]), logprobs, out)
            reason = choice.get("finish_reason")
            if reason and not self.finished:
                matched = choice.get("stop_reason")  # vLLM: the stop string that matched
                self._finish(reason, out, matched if isinstance(matched, str) else None)
        usage = chunk.get("usage")
        if usage:
            self.usage = parse_usage(usage)

    def end(self, out: list[Event]) -> None:
        """The end of the response: a Finish if none came, then the usage if any."""
        if not self.finished:
            self._finish("stop", out)
        if self.usage is not None:
            out.append(self.usage)

    def _content(self, text: str, logprobs: Any, out: list[Event]) -> None:
        entries = logprobs.get("content") if isinstance(logprobs, dict) else None
        if self._splitter is None:
            out.append(TextDelta(text, entries))
            return
        split = self._splitter.feed(text)
        if split.reasoning:
            out.append(ReasoningDelta(split.reasoning))
        if split.content:
            out.append(TextDelta(split.content, entries))
            self._splitter = None

    def _tool_calls(self, tool_calls: list[dict[str, Any]], out: list[Event]) -> None:
        for position, call in enumerate(tool_calls):
            index = call.get("index", position)
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise ValueError(f"a tool call index must be a whole number, not {index!r}")
            function = call.get("function") or {}
            arguments = function.get("arguments") or ""
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            if index not in self._calls:
                self._calls.add(index)
                call_id = call.get("id")
                if not isinstance(call_id, str) or not call_id:
                    call_id = f"call_{uuid.uuid4().hex[:24]}"
                name = _text(function.get("name") or "")
                out.append(ToolCallDelta(index, call_id, name, arguments))
            elif arguments:
                out.append(ToolCallDelta(index, arguments_fragment=arguments))

    def _finish(self, reason: str, out: list[Event], stop_sequence: str | None = None) -> None:
        if self._splitter is not None:
            split = self._splitter.flush()
            if split.reasoning:
                out.append(ReasoningDelta(split.reasoning))
            if split.content:
                out.append(TextDelta(split.content))
            self._splitter = None
        mapped = _FINISH.get(reason, "stop")
        if mapped == "stop" and self._calls:
            mapped = "tool_calls"
        out.append(Finish(mapped, stop_sequence if mapped == "stop" else None))
        self.finished = True


def _text(value: Any) -> str:
    """A text field of an upstream's chunk, which must be a string (TypeError otherwise)."""
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def _legacy_logprobs(logprobs: Any) -> dict[str, Any] | None:
    """Legacy completions logprobs (parallel lists) in the chat shape `{"content": [...]}`."""
    if not isinstance(logprobs, dict) or not logprobs.get("tokens"):
        return None
    tops = logprobs.get("top_logprobs") or []
    entries = []
    for i, (token, logprob) in enumerate(
        zip(logprobs["tokens"], logprobs.get("token_logprobs") or [], strict=False)
    ):
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        entries.append(
            {
                "token": token,
                "logprob": logprob,
                "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top.items()],
            }
        )
    return {"content": entries}


def fim_url(base_url: str, fim: FimStyle) -> str:
    """Where fill-in-the-middle requests go: OpenAI style, the ordinary `/completions`;
    DeepSeek's beta endpoint, `/beta/completions` in place of the base URL's `/v1`
    (`https://api.deepseek.com/v1` -> `https://api.deepseek.com/beta/completions`)."""
    base = base_url.rstrip("/")
    if fim != "deepseek_beta":
        return base + "/completions"
    parts = urlsplit(base)
    path = parts.path.removesuffix("/v1")
    return urlunsplit((parts.scheme, parts.netloc, path + "/beta/completions", "", ""))


class StreamDecoder(Protocol):
    """Turns an upstream's parsed stream chunks (or one JSON answer) into Events."""

    finished: bool

    def feed(self, chunk: dict[str, Any], out: list[Event]) -> None: ...
    def end(self, out: list[Event]) -> None: ...
