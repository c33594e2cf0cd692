"""Structured output for DeepSeek-V3.1: what a request's answer must look like, as a grammar.

A request's constraint (`Constraint`) comes from its `response_format` (plain JSON or a JSON
Schema) and its tools with their `tool_choice` ("required": at least one call; a named function:
a call of that function; "auto": calls of `strict` tools follow their schema once the model
opens a tool-call section). It travels to the engine as canonical JSON text (`Constraint.text`,
the grammar cache's key) and becomes an xgrammar structural tag there (`structural_tag`): JSON in
compact form (no free whitespace, so a weak model cannot pad forever), tool calls in V3.1's
format with the markers as their own tokens:

    <｜tool▁calls▁begin｜>(<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>)+<｜tool▁calls▁end｜>

Strict and non-strict schemas: a strict schema (`strict: true`, as the openai SDK's `.parse()`
sends) is enforced exactly, and a keyword the grammar engine cannot enforce is an error naming
its place (`ConstraintError`). A non-strict schema is guidance, as OpenAI documents it: it is
enforced where every keyword is supported, and otherwise relaxed to plain JSON (an object where
the schema asks for one, and for tool arguments) instead of refused. Either way no properties
beyond those a schema names are generated unless it allows them with `additionalProperties`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backend.text.tokenizer import SpecialIds


class ConstraintError(ValueError):
    """The request's format or tools cannot be enforced; `param` names the offending part."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


# JSON Schema keywords the grammar enforces (xgrammar's JSON Schema converter) or that only
# annotate. Any other keyword (not, if/then/else, uniqueItems, contains, dependentRequired, ...)
# would be silently ignored by the converter.
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
     "readOnly", "writeOnly", "strict", "name"}
)  # fmt: skip
_ENFORCED = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
     "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
     "definitions", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
     "exclusiveMinimum", "exclusiveMaximum", "minProperties", "maxProperties",
     "patternProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
     "multipleOf"}
)  # fmt: skip
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "propertyNames", "unevaluatedProperties",
                  "unevaluatedItems")  # fmt: skip


def unsupported_keyword(schema: Any, where: str) -> str | None:
    """The path of the first keyword in `schema` the grammar cannot enforce, or None."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, Mapping):
        return where
    for key, value in schema.items():
        path = f"{where}.{key}"
        if key in _ANNOTATIONS:
            continue
        if key not in _ENFORCED:
            return path
        found: str | None = None
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            for name, sub in value.items():
                if (found := unsupported_keyword(sub, f"{path}.{name}")) is not None:
                    break
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                if (found := unsupported_keyword(sub, f"{path}.{i}")) is not None:
                    break
        elif key in _SCHEMA_VALUES:
            found = unsupported_keyword(value, path)
        if found is not None:
            return found
    return None


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the answer must be. `json_schema`: the JSON answer's schema ({}: any JSON), None
    when no JSON answer is asked. `calls`: the tools a call may name, each (name, arguments'
    schema). `force_call`: the answer is tool calls (tool_choice required or named); otherwise
    the JSON answer or calls. `parallel`: more than one call allowed."""

    json_schema: dict[str, Any] | None
    calls: tuple[tuple[str, dict[str, Any], str], ...]
    force_call: bool
    parallel: bool

    @property
    def triggered(self) -> bool:
        """Only calls are constrained and the model may also answer in free text (tool_choice
        auto): the grammar starts once the model opens a tool-call section."""
        return self.json_schema is None and not self.force_call

    @property
    def text(self) -> str:
        """As JSON: the grammar cache's key (the schemas' key order kept: it orders the output)."""
        return json.dumps(
            {
                "json": self.json_schema,
                "calls": [list(c) for c in self.calls],
                "force": self.force_call,
                "parallel": self.parallel,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_text(cls, text: str) -> Constraint:
        data = json.loads(text)
        calls = tuple(
            (str(name), dict(schema), str(param)) for name, schema, param in data["calls"]
        )
        return cls(data["json"], calls, bool(data["force"]), bool(data["parallel"]))


_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _checked(schema: Any, strict: bool, param: str, fallback: dict[str, Any]) -> dict[str, Any]:
    """`schema` when the grammar can enforce it; for a non-strict schema, `fallback` otherwise."""
    if isinstance(schema, bool) or not isinstance(schema, Mapping):
        if strict:
            raise ConstraintError(f"'{param}' must be a JSON Schema object.", param)
        return fallback
    where = unsupported_keyword(schema, param)
    if where is None:
        return dict(schema)
    if strict:
        keyword = where.rsplit(".", 1)[-1]
        raise ConstraintError(
            f"The local engine cannot enforce the JSON Schema keyword '{keyword}' at '{where}' "
            "in strict mode; remove it or set strict to false.",
            where,
        )
    return fallback


def response_constraint(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON Schema the answer must follow ({} for JSON mode), or None for free text.
    Raises ConstraintError for a format it does not know or cannot enforce."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return dict(_ANY_OBJECT)  # JSON mode: an object, as OpenAI's
    if kind != "json_schema":
        raise ConstraintError(
            f"Unsupported response_format type {kind!r}: use text, json_object or json_schema.",
            "response_format.type",
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise ConstraintError(
            "response_format of type json_schema needs a 'json_schema' object.",
            "response_format.json_schema",
        )
    schema = spec.get("schema")
    if schema is None:
        return {}
    strict = spec.get("strict") is True
    is_object = isinstance(schema, Mapping) and schema.get("type") == "object"
    fallback = dict(_ANY_OBJECT) if is_object else {}
    return _checked(schema, strict, "response_format.json_schema.schema", fallback)


def tool_constraint(
    tools: Sequence[tuple[str, dict[str, Any] | None, bool]], tool_choice: Any
) -> tuple[tuple[tuple[str, dict[str, Any], str], ...], bool]:
    """(constrained calls, force_call) for tools given as (name, parameters, strict).

    "required" and a named choice force a call (of the named function alone); "auto" with at
    least one strict tool constrains any call the model opens (strict tools' arguments exactly,
    the others' as guidance); "none", or "auto" without strict tools, constrains nothing.
    """
    if not tools or tool_choice == "none":
        return (), False
    if tool_choice in (None, "auto"):
        if not any(strict for _, _, strict in tools):
            return (), False  # no strict tool: calls are free, as upstream
        chosen = list(enumerate(tools))
        return _calls(chosen), False
    if tool_choice == "required":
        chosen = list(enumerate(tools))
    elif isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        chosen = [(i, t) for i, t in enumerate(tools) if t[0] == name]
        if not chosen:
            raise ConstraintError(
                f"tool_choice names the function {name!r}, which is not among the tools.",
                "tool_choice",
            )
        chosen = chosen[:1]
    else:
        raise ConstraintError(
            f"Unsupported tool_choice {tool_choice!r}: use none, auto, required or a function.",
            "tool_choice",
        )
    return _calls(chosen), True


def _calls(
    chosen: Sequence[tuple[int, tuple[str, dict[str, Any] | None, bool]]],
) -> tuple[tuple[str, dict[str, Any], str], ...]:
    out = []
    for i, (name, params, strict) in chosen:
        param = f"tools[{i}].function.parameters"
        out.append((name, _checked(params or _ANY_OBJECT, strict, param, _ANY_OBJECT), param))
    return tuple(out)


def build_constraint(
    response_format: Mapping[str, Any] | None,
    tools: Sequence[tuple[str, dict[str, Any] | None, bool]],
    tool_choice: Any,
    parallel_tool_calls: bool | None,
) -> Constraint | None:
    """The request's constraint, or None when its answer is free. Raises ConstraintError."""
    json_schema = response_constraint(response_format)
    calls, force = tool_constraint(tools, tool_choice)
    if force:
        json_schema = None  # the answer is the call
    if json_schema is None and not calls:
        return None
    named = isinstance(tool_choice, Mapping)  # one call of that function
    return Constraint(json_schema, calls, force, parallel_tool_calls is not False and not named)


def grammar_starts_after(
    constraint: Constraint, special: SpecialIds, reasoning: bool
) -> tuple[int, ...]:
    """The tokens the output must show, in order, before the grammar applies: the end of
    thinking when the prompt opens reasoning; the tool-call section's opening marker when only
    calls are constrained and the model may also answer in free text (tool_choice auto)."""
    after = (special.think_end,) if reasoning else ()
    if constraint.triggered:
        after = (*after, special.tool_calls_begin)
    return after
