"""Parse OpenAI chat-completions and completions bodies into the normalized `ChatRequest`.

Unknown fields are ignored (clients send reasoning_content, prefix, store, metadata and more);
known fields with wrong types or values are a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import InvalidRequest
from gateway.wire.bounds import OutputTokens, Seed, TopK
from providers.types import ChatRequest, Message, Sampling, Tool, ToolCall

_IGNORE = ConfigDict(extra="ignore")
_B = TypeVar("_B", bound=BaseModel)


class _Function(BaseModel):
    model_config = _IGNORE
    name: str = Field(min_length=1)
    arguments: str | None = None


class _ToolCallIn(BaseModel):
    model_config = _IGNORE
    id: str = ""
    type: str = "function"
    function: _Function


class _MessageIn(BaseModel):
    model_config = _IGNORE
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class _FunctionDef(BaseModel):
    model_config = _IGNORE
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _ToolIn(BaseModel):
    model_config = _IGNORE
    type: Literal["function"] = "function"
    function: _FunctionDef


class _StreamOptions(BaseModel):
    model_config = _IGNORE
    include_usage: bool = False


class _Thinking(BaseModel):
    model_config = _IGNORE
    type: Literal["enabled", "disabled", "auto"] = "enabled"


Unit = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class _CommonBody(BaseModel):
    model_config = _IGNORE
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: _StreamOptions | None = None
    max_tokens: OutputTokens | None = None
    n: int = Field(default=1, ge=1, le=128)
    stop: str | list[str] | None = None
    seed: Seed | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: Unit | None = None
    top_k: TopK | None = None
    min_p: Unit | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    user: str | None = None
    thinking: _Thinking | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None


class ChatBody(_CommonBody):
    messages: list[_MessageIn] = Field(min_length=1)
    max_completion_tokens: OutputTokens | None = None
    tools: list[_ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class CompletionBody(_CommonBody):
    prompt: str | list[str]
    best_of: int | None = Field(default=None, ge=1, le=128)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)


def validate_body(cls: type[_B], data: Any) -> _B:
    """The body as `cls`, or a 400 naming the first offending field."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise InvalidRequest(f"Invalid value for '{param}': {err['msg']}", param=param) from None


def _thinking(body: _CommonBody) -> bool | None:
    """One internal switch from every dialect clients use (CLIENT-NOTES.md)."""
    if body.thinking is not None and body.thinking.type != "auto":
        return body.thinking.type == "enabled"
    kwargs = body.chat_template_kwargs or {}
    for key in ("thinking", "enable_thinking"):
        if isinstance(kwargs.get(key), bool):
            return bool(kwargs[key])
    if body.reasoning_effort is not None:
        return body.reasoning_effort not in ("none", "minimal")
    return None


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > 16 or any(not s for s in stops):
        raise InvalidRequest("'stop' takes at most 16 non-empty strings.", param="stop")
    return stops


def _check_n(body: _CommonBody) -> None:
    if body.n != 1:
        raise InvalidRequest("Only n=1 is supported.", param="n", code="unsupported_value")


def _sampling(
    body: _CommonBody, max_tokens: int | None, logprobs: bool, top: int | None
) -> Sampling:
    return Sampling(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        seed=body.seed,
        stop=_stops(body.stop),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        logprobs=logprobs,
        top_logprobs=top,
    )


def _message(m: _MessageIn) -> Message:
    calls = tuple(
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
        for c in (m.tool_calls or ())
    )
    if m.role == "tool" and not m.tool_call_id:
        raise InvalidRequest("A tool message needs 'tool_call_id'.", param="messages")
    return Message(
        role=m.role,
        content=m.content,
        name=m.name,
        tool_calls=calls,
        tool_call_id=m.tool_call_id,
        reasoning_content=m.reasoning_content,
    )


def parse_chat(data: Any, request_id: str) -> tuple[ChatBody, ChatRequest]:
    body = validate_body(ChatBody, data)
    _check_n(body)
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    request = ChatRequest(
        model=body.model,
        messages=tuple(_message(m) for m in body.messages),
        sampling=_sampling(
            body, body.max_completion_tokens or body.max_tokens, body.logprobs, body.top_logprobs
        ),
        tools=tuple(
            Tool(
                t.function.name,
                t.function.description,
                t.function.parameters,
                t.function.strict is True,
            )
            for t in body.tools or ()
        ),
        tool_choice=body.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=body.response_format,
        thinking=_thinking(body),
        stream=body.stream,
        user=body.user,
        request_id=request_id,
    )
    return body, request


def _check_prompt_text(data: Any) -> None:
    """A prompt of token ids (a list of integers, or a list of such lists) is refused by name,
    before validation would call it an invalid string."""
    prompt = data.get("prompt") if isinstance(data, dict) else None
    if isinstance(prompt, list) and any(
        isinstance(p, int) or (isinstance(p, list) and all(isinstance(t, int) for t in p))
        for p in prompt
    ):
        raise InvalidRequest(
            "Token-id prompts are not supported; send the prompt as text.",
            param="prompt",
            code="unsupported_value",
        )


def parse_completion(data: Any, request_id: str) -> tuple[CompletionBody, ChatRequest]:
    _check_prompt_text(data)
    body = validate_body(CompletionBody, data)
    _check_n(body)
    if body.best_of is not None and body.best_of != 1:
        raise InvalidRequest(
            "Only best_of=1 is supported.", param="best_of", code="unsupported_value"
        )
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise InvalidRequest("Only one prompt per request is supported.", param="prompt")
        prompt = prompt[0]
    extra: dict[str, Any] = {}
    if body.echo:
        extra["echo"] = True
    request = ChatRequest(
        model=body.model,
        messages=(),
        sampling=_sampling(body, body.max_tokens, body.logprobs is not None, body.logprobs),
        thinking=False if body.suffix is not None else _thinking(body),
        stream=body.stream,
        user=body.user,
        request_id=request_id,
        prompt=prompt,
        suffix=body.suffix,
        extra=extra,
    )
    return body, request
