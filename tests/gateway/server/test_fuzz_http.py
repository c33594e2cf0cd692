"""Property-based tests (hypothesis) of raw requests to every route: bodies that are JSON of any
shape, near-valid API bodies, compressed or not, arbitrary bytes; headers with any bytes
(credentials, content type and encoding, request ids, unknown headers). However hostile, no
answer is a 5xx, every answer has an `x-request-id`, and every error is in the shape of its
path's protocol (Anthropic's on the Messages API, OpenAI's elsewhere)."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from testkit.threaded import ADMIN_KEY, ThreadedGateway, assert_api_answer

BODY_ROUTES = [
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/v1/responses",
    "/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/admin/keys",
]
ROUTES = [
    *(("POST", path) for path in BODY_ROUTES),
    ("GET", "/v1/models"),
    ("GET", "/models"),
    ("GET", "/v1/models/echo-model"),
    ("GET", "/v1/messages"),
    ("POST", "/v1/messages/batches"),
    ("GET", "/v1/models/x%00y"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/admin/keys"),
    ("GET", "/admin/keys/nope"),
    ("PATCH", "/admin/keys/nope"),
    ("DELETE", "/admin/keys/nope"),
    ("POST", "/admin/keys/nope/rotate"),
    ("GET", "/admin/usage"),
    ("GET", "/nowhere"),
    ("PUT", "/v1/chat/completions"),
    ("DELETE", "/v1/models"),
]
FIELDS = [
    "model", "messages", "prompt", "input", "instructions", "tools", "tool_choice", "stream",
    "stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "stop",
    "seed", "temperature", "top_p", "top_k", "logprobs", "top_logprobs", "response_format",
    "thinking", "reasoning", "reasoning_effort", "chat_template_kwargs", "echo", "suffix",
    "user", "text", "metadata", "name", "rpm", "tpm", "budget_tokens", "budget_period",
    "budget_cost", "budget_cost_period",
    "max_concurrency", "expires_at", "models", "disabled", "previous_response_id",
    "stop_sequences", "system",
]  # fmt: skip
ROLES = ["system", "developer", "user", "assistant", "tool", "function", ""]
# Framing headers are left alone: a lie about them makes the server wait for bytes never sent.
FRAMING = {"content-length", "transfer-encoding", "connection", "host", "expect", "upgrade"}

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["echo-model", "user", "function", "auto", "2026-01-01T00:00:00Z"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
# Content blocks and parts of every API: a known type with any of the fields its kind uses.
BLOCK_TYPES = [
    "text", "image", "image_url", "input_text", "input_image", "tool_use", "tool_result",
    "thinking", "redacted_thinking", "document", "function_call", "function_call_output",
    "reasoning", "refusal", "output_text",
]  # fmt: skip
BLOCK_FIELDS = [
    "text", "source", "image_url", "id", "name", "input", "tool_use_id", "content", "is_error",
    "thinking", "signature", "data", "call_id", "arguments", "output", "summary",
    "encrypted_content", "cache_control",
]  # fmt: skip
blocks = st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(BLOCK_TYPES)}).flatmap(
        lambda head: st.dictionaries(st.sampled_from(BLOCK_FIELDS), json_values, max_size=3).map(
            lambda rest: {**rest, **head}
        )
    ),
    max_size=3,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(ROLES)},
        optional={
            "content": json_values | blocks,
            "tool_calls": json_values,
            "tool_call_id": scalars,
            "name": scalars,
        },
    ),
    max_size=3,
)
near_valid = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["echo-model", "reasoner-model", "mock/echo"])
        | st.text(max_size=20)
    },
    optional={
        "messages": messages,
        "input": json_values | messages | blocks,
        "prompt": json_values,
        "system": json_values | blocks,
    },
).flatmap(
    lambda base: st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5).map(
        lambda extra: {**base, **extra}
    )
)


def _encode(value: Any) -> bytes:
    return json.dumps(value).encode()


bodies = near_valid.map(_encode) | json_values.map(_encode) | st.binary(max_size=200) | st.just(b"")
header_bytes = st.binary(max_size=48).map(lambda b: b.replace(b"\r", b" ").replace(b"\n", b" "))
token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_0123456789", min_size=1, max_size=16)


@st.composite
def header_sets(draw: st.DrawFn, api_key: str) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    credential = draw(st.sampled_from(["api", "admin", "none", "garbage"]))
    if credential == "api":
        headers.append((b"Authorization", f"Bearer {api_key}".encode()))
    elif credential == "admin":
        headers.append((b"Authorization", f"Bearer {ADMIN_KEY}".encode()))
    elif credential == "garbage":
        name = draw(st.sampled_from([b"Authorization", b"x-api-key"]))
        prefix = draw(st.sampled_from([b"Bearer ", b"bearer  ", b"Basic ", b""]))
        headers.append((name, prefix + draw(header_bytes)))
    content_type = draw(
        st.sampled_from([b"application/json", b"text/plain", b"", b"multipart/form-data"])
        | header_bytes
    )
    headers.append((b"Content-Type", content_type))
    if draw(st.booleans()):
        encoding = draw(
            st.sampled_from([b"gzip", b"deflate", b"br", b"identity", b"gzip, deflate", b"zstd"])
            | header_bytes
        )
        headers.append((b"Content-Encoding", encoding))
    if draw(st.booleans()):
        headers.append((b"x-request-id", draw(header_bytes)))
    for name, value in draw(st.lists(st.tuples(token, header_bytes), max_size=3)):
        if name.lower() not in FRAMING:
            headers.append((name.encode(), value))
    return headers


def _request(method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    encoding = dict((k.lower(), v) for k, v in headers).get(b"content-encoding", b"")
    if encoding == b"gzip" and body[:1] == b"{":
        body = gzip.compress(body)
    elif encoding == b"deflate" and body[:1] == b"{":
        body = zlib.compress(body)
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    lines.append(f"Content-Length: {len(body)}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@pytest.fixture(scope="module")
def served() -> Iterator[ThreadedGateway]:
    with ThreadedGateway() as gateway:
        yield gateway


FUZZ: dict[str, Any] = dict(
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_any_body_on_a_body_route(served: ThreadedGateway, path: str) -> None:
    @settings(max_examples=250, **FUZZ)
    @given(body=bodies, headers=header_sets(served.key))
    def check(body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        answer = served.send(_request("POST", path, headers, body))
        assert_api_answer(answer.status, answer.headers, answer.body, path, path)

    check()


def test_any_headers_on_any_route(served: ThreadedGateway) -> None:
    @settings(max_examples=1000, **FUZZ)
    @given(
        route=st.sampled_from(ROUTES),
        query=st.none() | st.binary(max_size=40),
        headers=header_sets(served.key),
        body=bodies,
    )
    def check(
        route: tuple[str, str], query: bytes | None, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        method, path = route
        if query is not None:
            path += "?" + "".join(
                f"%{byte:02X}" if byte > 0x7E or byte < 0x21 else chr(byte) for byte in query
            )
        answer = served.send(_request(method, path, headers, body))
        assert_api_answer(answer.status, answer.headers, answer.body, f"{method} {path}", path)

    check()
