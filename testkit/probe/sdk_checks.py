"""Every endpoint through the official SDKs (openai, anthropic), on the local engine
(`deepseek-chat`) and on an upstream (`echo`, `tools`): the features real clients send, each
served, or refused with the documented 4xx in the protocol's shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import openai

from testkit.probe.bodies import (
    ANTHROPIC_TOOLS,
    CODEX_INPUT,
    CODEX_TOOLS,
    IMAGE_PARTS,
    IMAGE_RESULT,
    SYSTEM_BLOCKS,
    TOOL_HISTORY,
    TOOLS,
    USER,
)
from testkit.probe.results import Results
from testkit.probe.stage import Stage

Call = Callable[[], Awaitable[Any]]


async def _consume(stream: Any) -> None:
    async for _ in stream:
        pass


async def verdict(call: Call, expect: int | None) -> str | None:
    """None when `call` succeeds (`expect` None) or fails with HTTP `expect` in the right shape."""
    try:
        await call()
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        if exc.status_code != expect:
            return f"HTTP {exc.status_code}: {str(exc)[:200]}"
        if not exc.response.headers.get("x-request-id"):
            return "an error without x-request-id"
        return None
    except (openai.APIError, anthropic.APIError) as exc:  # an error event inside a stream
        return f"failed mid-stream: {str(exc)[:200]}"
    return None if expect is None else f"served, expected HTTP {expect}"


def chat_calls(
    c: openai.AsyncOpenAI, model: str, local: bool
) -> dict[str, tuple[Call, int | None]]:
    chat = c.chat.completions.create

    async def stream(**kw: Any) -> None:
        await _consume(await chat(model=model, messages=USER, max_tokens=8, stream=True, **kw))

    image = 400 if local else None
    return {
        "basic": (lambda: chat(model=model, messages=USER, max_tokens=8), None),
        "stream with usage": (lambda: stream(stream_options={"include_usage": True}), None),
        "n=2 is refused": (lambda: chat(model=model, messages=USER, max_tokens=8, n=2), 400),
        "logprobs": (
            lambda: chat(model=model, messages=USER, max_tokens=4, logprobs=True, top_logprobs=3),
            None,
        ),
        "stream logprobs": (lambda: stream(logprobs=True, top_logprobs=2), None),
        "json_schema": (
            lambda: chat(
                model=model,
                messages=USER,
                max_tokens=4,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}},
                },
            ),
            None,
        ),
        "stop string and list": (
            lambda: chat(model=model, messages=USER, max_tokens=4, stop=["world", "\n"]),
            None,
        ),
        "max_completion_tokens, user, metadata": (
            lambda: chat(
                model=model,
                messages=USER,
                max_completion_tokens=4,
                user="u",
                metadata={"a": "b"},
                store=False,
            ),
            None,
        ),
        "unknown fields": (
            lambda: chat(
                model=model,
                messages=USER,
                max_tokens=4,
                extra_body={"prefix": True, "service_tier": "auto", "web_search_options": {}},
            ),
            None,
        ),
        "tools, parallel": (
            lambda: chat(
                model=model,
                messages=USER,
                max_tokens=8,
                tools=TOOLS,
                tool_choice="auto",
                parallel_tool_calls=True,
            ),
            None,
        ),
        "tool_choice required": (
            lambda: chat(
                model=model, messages=USER, max_tokens=8, tools=TOOLS, tool_choice="required"
            ),
            None,
        ),
        "tool_choice none": (
            lambda: chat(model=model, messages=USER, max_tokens=8, tools=TOOLS, tool_choice="none"),
            None,
        ),
        "tool_choice named": (
            lambda: chat(
                model=model,
                messages=USER,
                max_tokens=8,
                tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_time"}},
            ),
            None,
        ),
        "parallel tool results, array content": (
            lambda: chat(model=model, messages=TOOL_HISTORY, max_tokens=8, tools=TOOLS),
            None,
        ),
        "stream tools": (lambda: stream(tools=TOOLS, tool_choice="required"), None),
        "image part": (
            lambda: chat(
                model=model, messages=[{"role": "user", "content": IMAGE_PARTS}], max_tokens=4
            ),
            image,
        ),
        "developer role and names": (
            lambda: chat(
                model=model,
                messages=[
                    {"role": "developer", "content": "be", "name": "d"},
                    {"role": "user", "content": "hi", "name": "u"},
                ],
                max_tokens=4,
            ),
            None,
        ),
        "empty messages": (lambda: chat(model=model, messages=[], max_tokens=4), 400),
        "seed -5, top_k -1": (
            lambda: chat(
                model=model, messages=USER, max_tokens=4, seed=-5, extra_body={"top_k": -1}
            ),
            None,
        ),
        "thinking switch": (
            lambda: chat(
                model=model,
                messages=USER,
                max_tokens=8,
                extra_body={"thinking": {"type": "enabled"}},
            ),
            None,
        ),
    }


def completion_calls(c: openai.AsyncOpenAI, model: str) -> dict[str, tuple[Call, int | None]]:
    create = c.completions.create

    async def stream() -> None:
        await _consume(
            await create(
                model=model,
                prompt="hello",
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        )

    return {
        "prompt": (lambda: create(model=model, prompt="hello", max_tokens=4), None),
        "prompt list of one": (lambda: create(model=model, prompt=["hello"], max_tokens=4), None),
        "prompt list of two is refused": (
            lambda: create(model=model, prompt=["a", "b"], max_tokens=4),
            400,
        ),
        "echo, suffix, logprobs": (
            lambda: create(
                model=model, prompt="def f(", suffix="pass", echo=True, logprobs=2, max_tokens=4
            ),
            None,
        ),
        "stream": (stream, None),
    }


def responses_calls(c: openai.AsyncOpenAI, model: str) -> dict[str, tuple[Call, int | None]]:
    create = c.responses.create

    async def stream() -> None:
        await _consume(
            await create(
                model=model,
                input=CODEX_INPUT,
                tools=CODEX_TOOLS,
                stream=True,
                store=False,
                max_output_tokens=16,
                include=["reasoning.encrypted_content"],
                reasoning={"effort": "low"},
            )
        )  # type: ignore[arg-type]

    return {
        "codex items and tools": (
            lambda: create(
                model=model, input=CODEX_INPUT, tools=CODEX_TOOLS, max_output_tokens=16, store=False
            ),
            None,
        ),  # type: ignore[arg-type]
        "codex stream": (stream, None),
        "instructions, include, prompt_cache_key": (
            lambda: create(
                model=model,
                instructions="sys",
                input="hi",
                max_output_tokens=16,
                include=["reasoning.encrypted_content"],
                prompt_cache_key="k",
            ),
            None,
        ),
        "previous_response_id is refused": (
            lambda: create(
                model=model, input="x", previous_response_id="resp_1", max_output_tokens=16
            ),
            400,
        ),
        "empty input is refused": (
            lambda: create(model=model, input=[], max_output_tokens=16),
            400,
        ),
    }


def messages_calls(
    a: anthropic.AsyncAnthropic, model: str, local: bool
) -> dict[str, tuple[Call, int | None]]:
    create = a.messages.create

    async def stream(**kw: Any) -> None:
        async with a.messages.stream(model=model, max_tokens=32, **kw) as events:
            await _consume(events)

    full: dict[str, Any] = {
        "system": SYSTEM_BLOCKS,
        "metadata": {"user_id": '{"session": "x"}'},
        "stop_sequences": ["world"],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    }
    return {
        "basic": (lambda: create(model=model, max_tokens=8, messages=USER), None),  # type: ignore[arg-type]
        "system blocks, metadata, stop_sequences, tools": (
            lambda: create(model=model, max_tokens=8, messages=USER, **full),
            None,
        ),  # type: ignore[arg-type]
        "stream": (lambda: stream(messages=USER, **full), None),
        "thinking budget": (
            lambda: create(
                model=model,
                max_tokens=64,
                messages=USER,
                thinking={"type": "enabled", "budget_tokens": 16},
            ),
            None,
        ),  # type: ignore[arg-type]
        "budget above max_tokens is refused": (
            lambda: create(
                model=model,
                max_tokens=8,
                messages=USER,
                thinking={"type": "enabled", "budget_tokens": 16},
            ),
            400,
        ),  # type: ignore[arg-type]
        "image in a tool_result": (
            lambda: create(model=model, max_tokens=8, messages=IMAGE_RESULT, tools=ANTHROPIC_TOOLS),
            400 if local else None,
        ),  # type: ignore[arg-type]
        "system role message": (
            lambda: create(
                model=model,
                max_tokens=8,
                messages=[
                    *USER,
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "again"},
                ],
            ),
            None,
        ),  # type: ignore[arg-type,list-item]
        "count_tokens": (
            lambda: a.messages.count_tokens(
                model=model, messages=USER, system=SYSTEM_BLOCKS, tools=ANTHROPIC_TOOLS
            ),
            None,
        ),  # type: ignore[arg-type]
        "claude model id": (
            lambda: create(model="claude-sonnet-4-5", max_tokens=8, messages=USER),
            None,
        ),  # type: ignore[arg-type]
    }


def model_calls(c: openai.AsyncOpenAI) -> dict[str, tuple[Call, int | None]]:
    odd = {"slashes": "a/b/c", "unicode": "模型✓", "very long": "m" * 4000, "direct": "mock/echo"}
    calls: dict[str, tuple[Call, int | None]] = {
        "list": (lambda: c.models.list(), None),
        "get": (lambda: c.models.retrieve("echo"), None),
    }
    for name, model_id in odd.items():
        served = name == "direct"  # mock/echo: the mock provider lets every model through
        calls[f"odd id: {name}"] = (
            lambda m=model_id: c.models.retrieve(m),
            None if served else 404,
        )
    return calls


async def run(stage: Stage, results: Results) -> None:
    c = openai.AsyncOpenAI(
        base_url=f"{stage.root}/v1", api_key=stage.key, max_retries=0, timeout=120
    )
    a = anthropic.AsyncAnthropic(base_url=stage.root, api_key=stage.key, max_retries=0, timeout=120)
    groups: list[tuple[str, dict[str, tuple[Call, int | None]]]] = []
    for model, local in (("deepseek-chat", True), ("echo", False), ("tools", False)):
        groups += [
            (f"chat {model}", chat_calls(c, model, local)),
            (f"messages {model}", messages_calls(a, model, local)),
            (f"responses {model}", responses_calls(c, model)),
        ]
        if model != "tools":
            groups.append((f"completions {model}", completion_calls(c, model)))
    groups.append(("models", model_calls(c)))
    for group, calls in groups:
        for name, (call, expect) in calls.items():

            async def check(call: Call = call, expect: int | None = expect) -> str | None:
                return await verdict(call, expect)

            await results.run(group, name, check, within_s=150)
    await c.close()
    await a.close()
