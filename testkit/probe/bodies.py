"""What the probe's SDK checks send: the bodies and parts real clients send (Cline's and the AI
SDK's tools and tool results, Codex's Responses items and tool types, Claude Code's system blocks
and tool results with images)."""

from __future__ import annotations

USER = [{"role": "user", "content": "hello there world"}]
PNG = "iVBORw0KGgo="
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
CALLED = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
]
TOOL_HISTORY = [
    *USER,
    {"role": "assistant", "content": None, "tool_calls": CALLED},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
    {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
]
IMAGE_PARTS = [
    {"type": "text", "text": "what is this"},
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
]
CODEX_INPUT = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
    {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd":"ls"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
    {"role": "user", "content": "and now?"},
]
CODEX_TOOLS = [
    {"type": "function", "name": "shell", "parameters": {"type": "object"}, "strict": False},
    {"type": "web_search"},
    {"type": "local_shell"},
    {"type": "custom", "name": "apply_patch", "format": {"type": "text"}},
]
SYSTEM_BLOCKS = [
    {"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
]
ANTHROPIC_TOOLS = [{"name": "lookup", "input_schema": {"type": "object"}}]
IMAGE_RESULT = [
    {"role": "user", "content": "look"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [
                    {"type": "text", "text": "a picture"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    },
                ],
            }
        ],
    },
]
