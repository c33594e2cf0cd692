"""Bad framing and bad input on raw sockets, on every body route and the admin API: each request
gets an answer (no hang, no dropped connection) that keeps the rules (no 5xx, an x-request-id,
an error in the path's shape), with the status the case calls for."""

from __future__ import annotations

import asyncio
import json

from testkit.probe.results import Results, answer_problem
from testkit.probe.stage import ADMIN_KEY, SLOW_CLIENT_S, Stage
from testkit.rawhttp import exchange, parse_answer, request_bytes

ROUTES = {
    "/v1/chat/completions": {"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "echo", "prompt": "hi"},
    "/v1/responses": {"model": "echo", "input": "hi"},
    "/v1/messages": {
        "model": "echo",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "/v1/messages/count_tokens": {"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
}


def bodies(valid: bytes) -> dict[str, tuple[bytes, dict[str, str], int | None]]:
    """Case -> (body, extra headers, the status it must get; None: any answer that keeps the
    rules). The Content-Length header is the body's unless a case sets its own."""
    hi = b'"hi"'
    return {
        "no content-type": (valid, {"Content-Type": ""}, 200),
        "text/plain": (valid, {"Content-Type": "text/plain"}, 200),
        "charset=utf-8": (valid, {"Content-Type": "application/json; charset=utf-8"}, 200),
        "utf-16 body": (valid.decode().encode("utf-16"), {}, 400),
        "byte order mark": (b"\xef\xbb\xbf" + valid, {}, 400),
        "an array": (b"[1, 2]", {}, 400),
        "a string": (b'"x"', {}, 400),
        "null": (b"null", {}, 400),
        "empty": (b"", {}, 400),
        "nested 100000 deep": (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, 400),
        "a huge number": (valid[:-1] + b', "max_tokens": 1' + b"0" * 5000 + b"}", {}, 400),
        "NaN": (valid[:-1] + b', "temperature": NaN}', {}, 400),
        "Infinity": (valid[:-1] + b', "top_p": Infinity}', {}, 400),
        "duplicate keys": (valid[:-1] + b', "model": "nope"}', {}, 404),
        "invalid utf-8": (valid.replace(hi, b'"h\xff\xfei"'), {}, 400),
        "lone surrogate": (valid.replace(hi, b'"h\\ud800i"'), {}, 400),
        "NUL in a string": (valid.replace(hi, b'"h\\u0000i"'), {}, 200),
        "null model": (valid.replace(b'"echo"', b"null"), {}, 400),
        "trailing garbage": (valid + b"xyz", {}, 400),
        "body shorter than Content-Length": (valid, {"Content-Length": str(len(valid) + 9)}, 408),
        "chunked": (
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(valid), valid),
            {"Transfer-Encoding": "chunked", "Content-Length": ""},
            200,
        ),
        "gzip declared, plain sent": (valid, {"Content-Encoding": "gzip"}, 400),
        "Expect: 100-continue": (valid, {"Expect": "100-continue"}, None),
        "Expect: other": (valid, {"Expect": "200-ok"}, 417),
        "10 MB declared": (b"", {"Content-Length": str(10 * 2**20)}, 413),
    }


async def raw_case(
    stage: Stage, path: str, body: bytes, extra: dict[str, str], want: int | None
) -> str | None:
    headers = {"Authorization": f"Bearer {stage.key}", "Content-Type": "application/json"}
    headers["Content-Length"] = str(len(body))
    headers.update(extra)
    headers = {k: v for k, v in headers.items() if v}
    answer = await exchange(
        stage.root, request_bytes("POST", path, headers, body), deadline_s=SLOW_CLIENT_S + 10
    )
    if answer.status == 100:  # the interim answer of Expect: 100-continue
        return None
    if want is not None and answer.status != want:
        return f"HTTP {answer.status}, expected {want}: {answer.body[:200]!r}"
    return answer_problem(answer.status, answer.headers, answer.body, path)


async def head_check(stage: Stage, path: str, headers: dict[str, str]) -> str | None:
    """A HEAD answer has headers only: read those."""
    reader, writer = await asyncio.open_connection("127.0.0.1", stage.port)
    try:
        writer.write(request_bytes("HEAD", path, headers))
        answer = parse_answer(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10))
    finally:
        writer.close()
    ok = answer.status < 500 and answer.headers.get("x-request-id")
    return None if ok else f"HTTP {answer.status} {dict(answer.headers)}"


METHODS = ["HEAD", "OPTIONS", "PUT", "DELETE", "PATCH", "TRACE"]
ADMIN_BODIES = {
    "negative budget": {"name": "a", "budget_tokens": -1},
    "float rpm": {"name": "a", "rpm": 1.5},
    "limit beyond 10^15": {"name": "a", "tpm": 10**20},
    "absurd date": {"name": "a", "expires_at": "99999-01-01"},
    "date in the past": {"name": "a", "expires_at": "2000-01-01T00:00:00Z"},
    "date out of range in UTC": {"name": "a", "expires_at": "0001-01-01T00:00:00+14:00"},
    "unknown field": {"name": "a", "foo": 1},
    "bad policy": {"name": "a", "policy": {"thinking": "maybe"}},
    "budget_period without budget": {"name": "a", "budget_period": "day"},
    "budget_cost_period without budget": {"name": "a", "budget_cost_period": "day"},
}


async def run(stage: Stage, results: Results) -> None:
    for path, valid in ROUTES.items():
        for case, (body, extra, want) in bodies(json.dumps(valid).encode()).items():

            async def check(
                path: str = path,
                body: bytes = body,
                extra: dict[str, str] = extra,
                want: int | None = want,
            ) -> str | None:
                return await raw_case(stage, path, body, extra, want)

            await results.run(f"raw {path}", case, check, within_s=SLOW_CLIENT_S + 15)
    for method in METHODS:
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/models", "/admin/keys"):

            async def method_check(method: str = method, path: str = path) -> str | None:
                headers = {"Authorization": f"Bearer {stage.key}"}
                if method == "HEAD":
                    return await head_check(stage, path, headers)
                answer = await exchange(
                    stage.root, request_bytes(method, path, headers), deadline_s=10
                )
                return answer_problem(answer.status, answer.headers, answer.body, path)

            await results.run("methods", f"{method} {path}", method_check, within_s=15)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"}
    for case, payload in ADMIN_BODIES.items():

        async def admin_check(payload: dict[str, object] = payload) -> str | None:
            raw = json.dumps(payload).encode()
            answer = await exchange(
                stage.root,
                request_bytes(
                    "POST", "/admin/keys", {**admin, "Content-Length": str(len(raw))}, raw
                ),
            )
            return (
                None
                if answer.status == 400
                and answer_problem(answer.status, answer.headers, answer.body, "/admin/keys")
                is None
                else f"HTTP {answer.status}: {answer.body[:200]!r}"
            )

        await results.run("admin", case, admin_check, within_s=15)
    for key_id in ("nope", "../x", "%00", "a" * 3000, "key_*"):

        async def id_check(key_id: str = key_id) -> str | None:
            answer = await exchange(
                stage.root, request_bytes("GET", f"/admin/keys/{key_id}", admin)
            )
            return None if answer.status == 404 else f"HTTP {answer.status}: {answer.body[:200]!r}"

        await results.run("admin", f"key id {key_id[:20]!r}", id_check, within_s=15)
