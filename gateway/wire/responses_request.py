"""Parse an OpenAI Responses API body (`POST /v1/responses`) into the normalized `ChatRequest`.

The gateway keeps no state: the whole history comes in `input` (Codex CLI sends `store: false`).
Mapping:
- `instructions` -> the first system message; `input` as a string -> one user message.
- message items -> messages (text parts joined; images kept as chat `image_url` parts).
- function_call items -> assistant tool_calls (consecutive calls, and calls right after an
  assistant message, share one assistant message); function_call_output -> tool messages (its
  text; its images, which tool messages cannot carry, follow the outputs in a user message).
- reasoning items -> the next assistant message's `reasoning_content`: our own
  `encrypted_content` (see `encode_reasoning`) decoded, else the item's reasoning or summary text.
- function tools pass; `namespace` tools are flattened (each call maps back through `ToolName`);
  hosted tools (web_search, ...) have no chat equivalent and are dropped.
- `reasoning.effort` "none"/"minimal" -> thinking off, any other effort -> on.
Unknown fields and unknown item types are ignored; known fields with wrong types are a 400
naming the field.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import InvalidRequest
from gateway.wire.bounds import OutputTokens
from gateway.wire.chat_request import validate_body
from plumbing.record import record
from providers.types import ChatRequest, Message, Role, Sampling, Tool, ToolCall

_IGNORE = ConfigDict(extra="ignore")
_REASONING_MARK = "gwr1."  # our encrypted_content: this mark + base64 of the UTF-8 reasoning
_TEXT_PARTS = ("input_text", "output_text", "text")
_INPUT_ROLES = ("user", "assistant", "system", "developer")


def encode_reasoning(text: str) -> str:
    """The `encrypted_content` carrying our reasoning text to the next turn."""
    return _REASONING_MARK + base64.b64encode(text.encode()).decode()


def decode_reasoning(blob: str) -> str | None:
    """The reasoning text of an `encrypted_content` we produced; None for anyone else's."""
    if not blob.startswith(_REASONING_MARK):
        return None
    try:
        return base64.b64decode(blob[len(_REASONING_MARK) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


@record
class ToolName:
    """A tool as the client named it: a flat function, or one inside a `namespace` tool."""

    name: str
    namespace: str | None = None


@record
class ParsedResponses:
    chat: ChatRequest
    echo: dict[str, Any]  # request fields the response object repeats
    tool_names: dict[str, ToolName]  # upstream (flat) tool name -> the client's name


class _Reasoning(BaseModel):
    model_config = _IGNORE
    effort: str | None = None


class ResponsesBody(BaseModel):
    model_config = _IGNORE
    model: str = Field(min_length=1)
    input: Any  # a string or a list of items, checked item by item
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    reasoning: _Reasoning | None = None
    max_output_tokens: OutputTokens | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stream: bool = False
    text: dict[str, Any] | None = None
    metadata: Any = None
    user: str | None = None
    previous_response_id: str | None = None


def _bad(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid value for '{param}': {what}", param=param)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(f"{where}.{key}", "expected a non-empty string.")
    return value


class _ToolTable:
    """Flattens the client's tools; remembers which flat name stands for which client tool."""

    def __init__(self) -> None:
        self.tools: list[Tool] = []
        self.names: dict[str, ToolName] = {}
        self._flat: dict[ToolName, str] = {}

    def add(self, spec: dict[str, Any], namespace: str | None, where: str) -> None:
        name = _string(spec, "name", where)
        flat = name if namespace is None or name not in self.names else f"{namespace}__{name}"
        description = spec.get("description")
        parameters = spec.get("parameters")
        self.tools.append(
            Tool(
                flat,
                description if isinstance(description, str) else None,
                parameters if isinstance(parameters, dict) else None,
                spec.get("strict") is True,
            )
        )
        self.names[flat] = ToolName(name, namespace)
        self._flat[ToolName(name, namespace)] = flat

    def flat(self, name: str, namespace: Any) -> str:
        key = ToolName(name, namespace if isinstance(namespace, str) else None)
        return self._flat.get(key, name)


def _tools(raw: list[dict[str, Any]] | None) -> _ToolTable:
    table = _ToolTable()
    for i, spec in enumerate(raw or ()):
        if spec.get("type") == "function":
            table.add(spec, None, f"tools.{i}")
        elif spec.get("type") == "namespace":
            namespace = _string(spec, "name", f"tools.{i}")
            inner = spec.get("tools")
            for j, tool in enumerate(inner if isinstance(inner, list) else ()):
                if isinstance(tool, dict) and tool.get("type") == "function":
                    table.add(tool, namespace, f"tools.{i}.tools.{j}")
    return table


def _tool_choice(raw: Any, table: _ToolTable) -> str | dict[str, Any] | None:
    if not table.tools or raw is None:
        return None
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, dict):
        raise _bad("tool_choice", "expected a string or an object.")
    if raw.get("type") == "function" and isinstance(raw.get("name"), str):
        return {
            "type": "function",
            "function": {"name": table.flat(raw["name"], raw.get("namespace"))},
        }
    if raw.get("type") == "allowed_tools" and raw.get("mode") in ("auto", "required"):
        return str(raw["mode"])
    return None  # a hosted tool's choice: that tool is not served here


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """Responses content (a string or parts) as chat content: text joined, images as parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "expected a string or a list of content parts.")
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            raise _bad(where, "every content part must be an object.")
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal") or "")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _reasoning_text(item: dict[str, Any]) -> str:
    blob = item.get("encrypted_content")
    ours = decode_reasoning(blob) if isinstance(blob, str) else None
    if ours is not None:
        return ours
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        entries = item.get(key)
        texts = [
            str(e.get("text") or "")
            for e in (entries if isinstance(entries, list) else ())
            if isinstance(e, dict) and e.get("type") == kind
        ]
        if any(texts):
            return "\n\n".join(t for t in texts if t)
    return ""


class _History:
    """Chat messages built from Responses input items, in order."""

    def __init__(self, table: _ToolTable) -> None:
        self.messages: list[Message] = []
        self._table = table
        self._reasoning: list[str] = []  # waiting for the next assistant message
        self._images: list[dict[str, Any]] = []  # of the tool outputs just read (see `close`)

    def _take_reasoning(self) -> str | None:
        text = "\n\n".join(self._reasoning) or None
        self._reasoning = []
        return text

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise _bad(where, "every input item must be an object.")
        kind = item.get("type", "message" if "role" in item else None)
        if kind != "function_call_output":
            self.close()
        if kind == "message":
            self._message(item, where)
        elif kind == "function_call":
            self._call(item, where)
        elif kind == "function_call_output":
            output = item.get("output")
            if output is None:
                raise _bad(f"{where}.output", "a function_call_output needs 'output'.")
            content = _parts(output, f"{where}.output")
            call_id = _string(item, "call_id", where)
            if not isinstance(content, str):
                images = [p for p in content if p["type"] == "image_url"]
                if images:
                    announce = {"type": "text", "text": f"Images returned by tool call {call_id}:"}
                    self._images += [announce, *images]
                content = "".join(p.get("text", "") for p in content)
            self.messages.append(Message(role="tool", content=content, tool_call_id=call_id))
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                self._reasoning.append(text)

    def close(self) -> None:
        """Place the images of the tool outputs just read: tool messages carry text only, so
        they follow the outputs in a user message of their own."""
        if self._images:
            self.messages.append(Message(role="user", content=self._images))
            self._images = []

    def _message(self, item: dict[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in _INPUT_ROLES:
            raise _bad(f"{where}.role", f"expected one of {', '.join(_INPUT_ROLES)}.")
        content = _parts(item.get("content"), f"{where}.content")
        if role == "assistant":
            reasoning = self._take_reasoning()
            self.messages.append(
                Message(role="assistant", content=content, reasoning_content=reasoning)
            )
            return
        self._reasoning = []
        self.messages.append(Message(role=cast(Role, role), content=content))

    def _call(self, item: dict[str, Any], where: str) -> None:
        arguments = item.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise _bad(f"{where}.arguments", "expected a JSON string.")
        name = self._table.flat(_string(item, "name", where), item.get("namespace"))
        call = ToolCall(_string(item, "call_id", where), name, arguments or "{}")
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant" and not self._reasoning:
            self.messages[-1] = Message(
                role="assistant",
                content=last.content,
                tool_calls=(*last.tool_calls, call),
                reasoning_content=last.reasoning_content,
            )
        else:
            reasoning = self._take_reasoning()
            self.messages.append(
                Message(role="assistant", tool_calls=(call,), reasoning_content=reasoning)
            )


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        keys = ("name", "schema", "strict", "description")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in keys if k in fmt}}
    return None


def _thinking(body: ResponsesBody) -> bool | None:
    effort = body.reasoning.effort if body.reasoning is not None else None
    return None if effort is None else effort not in ("none", "minimal")


def _echo(body: ResponsesBody) -> dict[str, Any]:
    return {
        "instructions": body.instructions,
        "tools": body.tools or [],
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None},
        "text": body.text or {"format": {"type": "text"}},
        "metadata": body.metadata if isinstance(body.metadata, dict) else {},
        "store": False,
        "user": body.user,
    }


def parse_responses(data: Any, request_id: str) -> ParsedResponses:
    body = validate_body(ResponsesBody, data)
    if body.previous_response_id is not None:
        raise InvalidRequest(
            "This gateway stores no responses: send the whole conversation in 'input' "
            "instead of 'previous_response_id'.",
            param="previous_response_id",
            code="unsupported_parameter",
        )
    table = _tools(body.tools)
    history = _History(table)
    if body.instructions:
        history.messages.append(Message(role="system", content=body.instructions))
    if isinstance(body.input, str):
        history.add({"type": "message", "role": "user", "content": body.input}, "input")
    elif isinstance(body.input, list):
        for i, item in enumerate(body.input):
            history.add(item, f"input.{i}")
    else:
        raise _bad("input", "expected a string or a list of input items.")
    history.close()
    if not history.messages:
        raise _bad("input", "the request has no messages.")
    chat = ChatRequest(
        model=body.model,
        messages=tuple(history.messages),
        sampling=Sampling(
            max_tokens=body.max_output_tokens, temperature=body.temperature, top_p=body.top_p
        ),
        tools=tuple(table.tools),
        tool_choice=_tool_choice(body.tool_choice, table),
        parallel_tool_calls=body.parallel_tool_calls if table.tools else None,
        response_format=_response_format(body.text),
        thinking=_thinking(body),
        stream=body.stream,
        user=body.user,
        request_id=request_id,
    )
    return ParsedResponses(chat, _echo(body), table.names)
