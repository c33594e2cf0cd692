"""The mock upstream's scenario language (testkit/mock_upstream.py, whose docstring lists the
scenarios and options): a request's `model` name parsed into `Options`, and the `Plan` of what
to answer (words, reasoning, tool calls, usage) made from the request's body."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

SCENARIOS = (
    "echo",
    "tools",
    "reasoning-content",
    "reasoning",
    "think-inline",
    "fail",
    "slow",
    "keepalive",
    "die-midstream",
    "stall",
    "error-midstream",
    "hang",
)
REASONING_TEXT = "The user wants their words back. I will repeat them."
_WORD = re.compile(r"\S+\s*")
_FLAGS = frozenset({"crlf", "nousage", "nodone", "json", "comments"})


@dataclass
class Options:
    scenario: str
    status: int = 0  # fail-<status>
    chunks: int | None = None
    delay: float = 0.0
    gap: float = 0.0
    after: int | None = None
    cached: int | None = None
    hit: int | None = None
    calls: int = 1
    flags: frozenset[str] = frozenset()


@dataclass
class Plan:
    """What a request is answered with: the deltas after the role chunk, then a finish."""

    deltas: list[dict[str, Any]]
    finish_reason: str
    usage: dict[str, Any]


def parse_model(model: str) -> Options | None:
    """Options from a model name, None when it names no scenario."""
    scenario = next(
        (
            s
            for s in sorted(SCENARIOS, key=len, reverse=True)
            if model == s or model.startswith(s + "-")
        ),
        None,
    )
    if scenario is None:
        return None
    opts = Options(scenario=scenario, delay=1.0 if scenario == "slow" else 0.0)
    tokens = model[len(scenario) + 1 :].split("-") if model != scenario else []
    if scenario == "fail":
        if not tokens or not tokens[0].isdigit():
            return None
        opts.status = int(tokens.pop(0))
    flags: set[str] = set()
    while tokens:
        key = tokens.pop(0)
        if key in _FLAGS:
            flags.add(key)
            continue
        if not tokens:
            return None
        value = tokens.pop(0)
        try:
            if key in ("delay", "gap"):
                setattr(opts, key, float(value))
            elif key in ("chunks", "after", "cached", "hit", "calls"):
                setattr(opts, key, int(value))
            else:
                return None
        except ValueError:
            return None
    opts.flags = frozenset(flags)
    return opts


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return ""


def prompt_tokens(body: dict[str, Any]) -> int:
    """The mock's deterministic prompt token count."""
    if "prompt" in body:
        return len(_text(body["prompt"]).split()) + 1
    messages = body.get("messages") or []
    return sum(len(_text(m.get("content")).split()) + 1 for m in messages)


def _last_user_text(body: dict[str, Any]) -> str:
    if "prompt" in body:
        return _text(body["prompt"])
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def _answer(body: dict[str, Any], opts: Options, budget: int | None) -> tuple[list[str], str]:
    """The echo answer's words (each keeps its trailing space) and its finish reason."""
    words = _WORD.findall(_last_user_text(body)) or ["ok"]
    if opts.chunks is not None:
        words = [words[i % len(words)].strip() + " " for i in range(opts.chunks)]
        if words:
            words[-1] = words[-1].strip()
    text = "".join(words)
    stops = body.get("stop") or []
    cut = min(
        (i for s in ([stops] if isinstance(stops, str) else stops) if (i := text.find(s)) >= 0),
        default=-1,
    )
    if cut >= 0:
        words = _WORD.findall(text[:cut])
    if budget is not None and len(words) > budget:
        return words[:budget], "length"
    return words, "stop"


def make_plan(body: dict[str, Any], opts: Options) -> Plan:
    budget = body.get("max_completion_tokens") or body.get("max_tokens")
    reasoning_words: list[str] = []
    if opts.scenario in ("reasoning-content", "reasoning", "think-inline"):
        reasoning_words = _WORD.findall(REASONING_TEXT)
    answer_budget = None if budget is None else max(budget - len(reasoning_words), 0)
    words, finish = _answer(body, opts, answer_budget)
    deltas: list[dict[str, Any]]
    if opts.scenario == "tools":
        deltas, finish, words = _tool_deltas(body, opts), "tool_calls", []
    elif opts.scenario == "think-inline":
        inline = "<think>" + "".join(reasoning_words) + "</think>" + "".join(words)
        deltas = [{"content": inline[i : i + 4]} for i in range(0, len(inline), 4)]
    else:
        field_name = "reasoning" if opts.scenario == "reasoning" else "reasoning_content"
        deltas = [{field_name: w} for w in reasoning_words] + [{"content": w} for w in words]
    n_prompt = prompt_tokens(body)
    n_completion = len(reasoning_words) + len(words)
    usage: dict[str, Any] = {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "total_tokens": n_prompt + n_completion,
    }
    if reasoning_words:
        usage["completion_tokens_details"] = {"reasoning_tokens": len(reasoning_words)}
    if opts.cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": opts.cached}
    if opts.hit is not None:
        usage["prompt_cache_hit_tokens"] = opts.hit
        usage["prompt_cache_miss_tokens"] = n_prompt - opts.hit
    return Plan(deltas, finish, usage)


def _tool_deltas(body: dict[str, Any], opts: Options) -> list[dict[str, Any]]:
    names = [t["function"]["name"] for t in body.get("tools") or [] if "function" in t] or [
        "lookup"
    ]
    arguments = json.dumps({"query": _last_user_text(body)})
    deltas: list[dict[str, Any]] = []
    for index in range(opts.calls):
        head = {"index": index, "id": f"call_mock{index}", "type": "function"}
        head["function"] = {"name": names[index % len(names)], "arguments": ""}
        deltas.append({"tool_calls": [head]})
        for i in range(0, len(arguments), 8):
            piece = {"index": index, "function": {"arguments": arguments[i : i + 8]}}
            deltas.append({"tool_calls": [piece]})
    return deltas


def message_of(plan: Plan) -> dict[str, Any]:
    """The non-streaming message equal to the plan's deltas put together."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls: dict[int, dict[str, Any]] = {}
    for delta in plan.deltas:
        for key in ("content", "reasoning_content", "reasoning"):
            if key in delta:
                message[key] = (message.get(key) or "") + delta[key]
        for piece in delta.get("tool_calls", ()):
            call = calls.setdefault(
                piece["index"],
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = piece.get("id", call["id"])
            call["function"]["name"] += piece["function"].get("name", "")
            call["function"]["arguments"] += piece["function"]["arguments"]
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message
