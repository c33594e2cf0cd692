"""Parse an Anthropic Messages API body (`POST /v1/messages`, `/v1/messages/count_tokens`) into
the normalized `ChatRequest`.

Mapping:
- `system` (a string or text blocks) and any message with role "system" (Claude Code sends one
  inside `messages`) -> system messages at the front, in order.
- user content: text blocks -> the message's text (blocks joined by a blank line); `image` ->
  an OpenAI `image_url` part (a data: URL for base64 sources), refused with a 400 by routes that
  take no images; `tool_result` -> a tool message ahead of the user's other blocks (content a
  string or text and image blocks; `is_error` prefixes "Error: "; its images, which tool
  messages cannot carry, open the user message after it, announced by a line naming the call);
  `document` is refused with a 400.
- assistant content: text blocks joined; `tool_use` -> tool_calls (input as JSON text);
  `thinking` -> reasoning_content when its signature is this gateway's for the same key (see
  gateway/wire/thinking_signature.py), else dropped, as is `redacted_thinking`. An assistant message
  left with nothing is dropped, so a thinking-only turn never fails the request.
- `tools`: custom tools (`input_schema`) pass; Anthropic-defined and server tools (a `type`
  other than "custom") have no equivalent here and are dropped.
- `tool_choice`: auto -> "auto", any -> "required", tool -> that function, none -> "none";
  `disable_parallel_tool_use` -> parallel_tool_calls false.
- `thinking`: enabled -> on, disabled -> off, adaptive -> the route's default. `budget_tokens`
  (below max_tokens) is the reasoning budget, combined with the key's `max_reasoning_tokens`
  (the smaller wins): the local engine enforces it exactly; DeepSeek's API takes none.
- `stop_sequences` -> stop; `metadata.user_id` -> user; `cache_control` is accepted and ignored.
The body itself also travels in `anthropic_body`, for upstreams that speak Messages, less the
thinking blocks they would refuse (unsigned, or signed by this gateway) and any assistant
message that leaves empty.
Unknown fields and unknown block types are ignored; known fields with wrong types are a 400
naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import InvalidRequest
from gateway.wire.bounds import INT32_MAX, OutputTokens
from gateway.wire.chat_request import validate_body
from gateway.wire.thinking_signature import is_gateway_signature
from providers.types import ChatRequest, Message, Sampling, Tool, ToolCall

_IGNORE = ConfigDict(extra="ignore")
# (text, signature) -> whether the thinking block is ours to trust.
Trust = Callable[[str, str], bool]


class _Thinking(BaseModel):
    model_config = _IGNORE
    type: Literal["enabled", "disabled", "adaptive", "auto"]
    budget_tokens: OutputTokens | None = None


class _ToolChoice(BaseModel):
    model_config = _IGNORE
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class _Metadata(BaseModel):
    model_config = _IGNORE
    user_id: str | None = None


class _MessageIn(BaseModel):
    model_config = _IGNORE
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class CountTokensBody(BaseModel):
    model_config = _IGNORE
    model: str = Field(min_length=1)
    messages: list[_MessageIn] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: _ToolChoice | None = None
    thinking: _Thinking | None = None


class MessagesBody(CountTokensBody):
    max_tokens: OutputTokens
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    metadata: _Metadata | None = None


def _bad(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid value for '{param}': {what}", param=param)


def _block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where}.text", "a text block needs a string 'text'.")
    return text


def _texts(content: str | list[dict[str, Any]], where: str) -> str:
    """A string, or the text of text blocks joined by a blank line (other blocks refused)."""
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(content):
        if block.get("type") != "text":
            raise _bad(f"{where}.{i}.type", "only text blocks are accepted here.")
        texts.append(_block_text(block, f"{where}.{i}"))
    return "\n\n".join(texts)


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _bad(f"{where}.source", "an image block needs a 'source' object.")
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") or "image/png"
        url = f"data:{media};base64,{source['data']}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise _bad(f"{where}.source", "expected a base64 or url image source.")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(block: dict[str, Any], where: str) -> tuple[Message, list[dict[str, Any]]]:
    """The tool message, and the image parts of the result (tool messages carry text only, so
    they travel in the user message that follows, announced by a line naming the call)."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_use_id", "a tool_result needs its tool_use_id.")
    content = block.get("content", "")
    images: list[dict[str, Any]] = []
    if isinstance(content, list):
        parts = []
        for i, inner in enumerate(content):
            if not isinstance(inner, dict):
                raise _bad(f"{where}.content.{i}", "expected a content block.")
            if inner.get("type") == "text":
                parts.append(_block_text(inner, f"{where}.content.{i}"))
            elif inner.get("type") == "image":
                images.append(_image(inner, f"{where}.content.{i}"))
        text = "\n\n".join(parts)
    elif isinstance(content, str):
        text = content
    else:
        raise _bad(f"{where}.content", "expected a string or content blocks.")
    if block.get("is_error") is True:
        text = "Error: " + text
    if images:
        announce = {"type": "text", "text": f"Images returned by tool call {call_id}:"}
        images.insert(0, announce)
    return Message(role="tool", content=text, tool_call_id=call_id), images


def _user(content: str | list[dict[str, Any]], where: str) -> list[Message]:
    if isinstance(content, str):
        return [Message(role="user", content=content)]
    results: list[Message] = []
    result_images: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        kind, at = block.get("type"), f"{where}.{i}"
        if kind == "text":
            parts.append({"type": "text", "text": _block_text(block, at)})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            result, images = _tool_result(block, at)
            results.append(result)
            result_images += images
        elif kind == "document":
            raise _bad(f"{at}.type", "document blocks are not supported by this gateway.")
    parts = result_images + parts
    if not parts:
        return results
    if all(p["type"] == "text" for p in parts):
        text = "\n\n".join(p["text"] for p in parts)
        return [*results, Message(role="user", content=text)]
    return [*results, Message(role="user", content=parts)]


def _assistant(content: str | list[dict[str, Any]], where: str, trust: Trust) -> Message | None:
    if isinstance(content, str):
        return Message(role="assistant", content=content)
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(content):
        kind, at = block.get("type"), f"{where}.{i}"
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind == "thinking":
            text, signature = block.get("thinking"), block.get("signature")
            if isinstance(text, str) and isinstance(signature, str) and trust(text, signature):
                reasoning.append(text)
        elif kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str) or not name:
                raise _bad(at, "a tool_use block needs 'id' and 'name'.")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(ToolCall(call_id, name, arguments))
    text = "".join(texts)
    if not text and not calls and not reasoning:
        return None
    return Message(
        role="assistant",
        content=text,
        tool_calls=tuple(calls),
        reasoning_content="\n\n".join(reasoning) or None,
    )


def _tools(raw: list[dict[str, Any]] | None) -> tuple[Tool, ...]:
    tools = []
    for i, spec in enumerate(raw or ()):
        if spec.get("type", "custom") != "custom":
            continue
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"tools.{i}.name", "expected a non-empty string.")
        schema = spec.get("input_schema")
        if not isinstance(schema, dict):
            raise _bad(f"tools.{i}.input_schema", "expected a JSON schema object.")
        description = spec.get("description")
        text = description if isinstance(description, str) else None
        tools.append(Tool(name, text, schema, spec.get("strict") is True))
    return tuple(tools)


def _tool_choice(
    choice: _ToolChoice | None, tools: tuple[Tool, ...]
) -> str | dict[str, Any] | None:
    if choice is None or not tools:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise _bad("tool_choice.name", "tool_choice of type 'tool' needs the tool's name.")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _thinking(body: CountTokensBody, max_tokens: int | None) -> bool | None:
    if body.thinking is None or body.thinking.type in ("adaptive", "auto"):
        return None
    budget = body.thinking.budget_tokens
    enabled = body.thinking.type == "enabled"
    if enabled and max_tokens is not None and budget is not None and budget >= max_tokens:
        raise _bad("thinking.budget_tokens", "must be less than max_tokens.")
    return enabled


def _budget(body: CountTokensBody) -> int | None:
    """`thinking.budget_tokens` of an enabled thinking request: the reasoning budget (the local
    engine ends thinking after it; reasoning_effort upstreams get the nearest effort)."""
    if body.thinking is None or body.thinking.type != "enabled":
        return None
    return body.thinking.budget_tokens


def _history(body: CountTokensBody, trust: Trust) -> list[Message]:
    system = [_texts(body.system, "system")] if body.system else []
    history: list[Message] = []
    for i, m in enumerate(body.messages):
        where = f"messages.{i}.content"
        if m.role == "system":
            system.append(_texts(m.content, where))
        elif m.role == "user":
            history += _user(m.content, where)
        else:
            message = _assistant(m.content, where, trust)
            if message is not None:
                history.append(message)
    if not history:
        raise _bad("messages", "the request has no user or assistant content.")
    return [Message(role="system", content=s) for s in system if s] + history


def _chat(body: CountTokensBody, request_id: str, trust: Trust, sampling: Sampling) -> ChatRequest:
    tools = _tools(body.tools)
    return ChatRequest(
        model=body.model,
        messages=tuple(_history(body, trust)),
        sampling=sampling,
        tools=tools,
        tool_choice=_tool_choice(body.tool_choice, tools),
        parallel_tool_calls=(
            False
            if tools and body.tool_choice and body.tool_choice.disable_parallel_tool_use
            else None
        ),
        thinking=_thinking(body, sampling.max_tokens),
        request_id=request_id,
    )


def parse_messages(data: Any, request_id: str, trust: Trust) -> ChatRequest:
    body = validate_body(MessagesBody, data)
    stops = tuple(body.stop_sequences or ())
    if any(not s for s in stops):
        raise _bad("stop_sequences", "stop sequences must be non-empty strings.")
    sampling = Sampling(
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=stops,
        max_reasoning_tokens=_budget(body),
    )
    chat = _chat(body, request_id, trust, sampling)
    user = body.metadata.user_id if body.metadata else None
    return replace(chat, stream=body.stream, user=user, anthropic_body=_upstream_body(data))


def _upstream_body(data: dict[str, Any]) -> dict[str, Any]:
    """The client's body for a Messages upstream: thinking blocks it can verify only."""
    messages = []
    for message in data["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = [block for block in content if not _foreign_thinking(block)]
            if not content:
                continue
            message = {**message, "content": content}
        messages.append(message)
    return {**data, "messages": messages}


def _foreign_thinking(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") != "thinking":
        return False
    signature = block.get("signature")
    return not isinstance(signature, str) or not signature or is_gateway_signature(signature)


def parse_count_tokens(data: Any, request_id: str, trust: Trust) -> ChatRequest:
    body = validate_body(CountTokensBody, data)
    return _chat(body, request_id, trust, Sampling())
