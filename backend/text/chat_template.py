"""Render DeepSeek-V3.1's chat template from OpenAI-style messages.

The template itself (`chat_template` of tokenizer_config.json) runs in a sandboxed Jinja
environment configured like HF transformers' `apply_chat_template` (same trim settings, `tojson`,
`raise_exception`, `strftime_now`), so its output is byte-identical to what transformers renders.

What the V3.1 template does and does not do, and what this module adds:
- It takes `thinking`: the generation prompt ends in `<｜Assistant｜><think>` (on) or
  `<｜Assistant｜></think>` (off). After tool results it adds no generation prompt at all.
- It ignores `tools`. DeepSeek's model card asks for the tools to be described in the system
  prompt under `## Tools`; `tools_prompt` writes that block and `render` adds it as a last system
  message (the template joins all system messages with a blank line, ahead of the conversation).
- It concatenates strings, so `normalize_messages` first turns OpenAI messages into plain
  strings (content parts joined, None -> "", arguments dicts -> JSON) and drops earlier reasoning
  (`reasoning_content`, and inline text up to a `</think>` in assistant content).
- `escape` is applied to every client-supplied string before rendering (see tokenizer.py: it
  keeps special-token text in those strings from being read as special tokens).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

Message = Mapping[str, Any]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_THINK_END = "</think>"


class ChatFormatError(ValueError):
    """The messages or tools cannot be rendered (unknown role, non-text content, bad shape)."""


class UnsupportedContent(ChatFormatError):
    """A content part that is not text (an image, audio, a file): the model reads text only."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"unsupported content part: {kind!r}")
        self.kind = kind


def _identity(text: str) -> str:
    return text


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _content_text(content: Any) -> str:
    """OpenAI content (None, str, or a list of text parts) as one string; parts joined by \\n."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type", "text") not in _TEXT_PART_TYPES:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise UnsupportedContent(str(kind))
            if not isinstance(part.get("text"), str):
                raise ChatFormatError("a text content part needs a string 'text'")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ChatFormatError(f"content must be a string or a list of parts, not {type(content)}")


def _drop_inline_reasoning(content: str) -> str:
    return content.split(_THINK_END, 1)[1] if _THINK_END in content else content


def _tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ChatFormatError("a tool call needs function.name")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"function": {"name": function["name"], "arguments": arguments}}


def normalize_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """OpenAI chat messages -> the plain shape the V3.1 template reads.

    Each result has `role` (developer becomes system) and `content` (a string); assistant
    messages with a non-empty `tool_calls` keep it as [{function: {name, arguments: str}}].
    Assistant content loses everything up to and including its first `</think>`;
    `reasoning_content`, `name`, `tool_call_id` and unknown fields are dropped (the template
    reads none of them). Raises ChatFormatError on an unknown role or non-text content.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            role = message.get("role") if isinstance(message, Mapping) else message
            raise ChatFormatError(f"unsupported message role: {role!r}")
        role = "system" if message["role"] == "developer" else message["role"]
        content = _content_text(message.get("content"))
        normalized: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            normalized["content"] = _drop_inline_reasoning(content)
            calls = message.get("tool_calls")
            if calls:
                normalized["tool_calls"] = [_tool_call(call) for call in calls]
        out.append(normalized)
    return out


def tools_prompt(tools: Sequence[Mapping[str, Any]], escape: Callable[[str], str]) -> str:
    """The `## Tools` system-prompt block of DeepSeek-V3.1's model card for OpenAI tools.

    Accepts `{"type": "function", "function": {...}}` and bare `{name, description,
    parameters}` entries. `escape` is applied to the client's names, descriptions and parameter
    JSON, not to the format instructions (their special tokens are meant as such).
    """
    sections = []
    for tool in tools:
        function = tool.get("function", tool)
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ChatFormatError("every tool needs function.name")
        description = function.get("description") or ""
        parameters = json.dumps(function.get("parameters") or {}, ensure_ascii=False)
        sections.append(
            f"### {escape(name)}\nDescription: {escape(description)}\n\n"
            f"Parameters: {escape(parameters)}\n\n"
        )
    return (
        "## Tools\nYou have access to the following tools:\n\n"
        + "".join(sections)
        + "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>"
        "tool_call_arguments<｜tool▁call▁end｜>{additional_tool_calls}<｜tool▁calls▁end｜>\n\n"
        "Where:\n"
        "- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's "
        "Parameters Schema\n"
        "- For multiple tool calls, chain them directly without separators or spaces"
    )


def _escape_message(message: dict[str, Any], escape: Callable[[str], str]) -> dict[str, Any]:
    escaped = {**message, "content": escape(message["content"])}
    if "tool_calls" in message:
        escaped["tool_calls"] = [
            {"function": {key: escape(value) for key, value in call["function"].items()}}
            for call in message["tool_calls"]
        ]
    return escaped


class ChatTemplate:
    """A compiled chat template plus the special tokens it reads (`bos_token`, `eos_token`)."""

    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._template = env.from_string(source)
        self._special = {"bos_token": bos_token, "eos_token": eos_token}

    def render(
        self,
        messages: Sequence[Message],
        *,
        thinking: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        escape: Callable[[str], str] = _identity,
    ) -> str:
        """The prompt text for `messages` (OpenAI shape, see `normalize_messages`).

        With tools, their `## Tools` block is appended to the system prompt.
        """
        normalized = normalize_messages(messages)
        if tools:
            normalized.append({"role": "system", "content": tools_prompt(tools, escape)})
            escaped = [_escape_message(m, escape) for m in normalized[:-1]] + normalized[-1:]
        else:
            escaped = [_escape_message(m, escape) for m in normalized]
        try:
            return self._template.render(
                messages=escaped,
                add_generation_prompt=add_generation_prompt,
                thinking=thinking,
                **self._special,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatFormatError(str(exc)) from exc
