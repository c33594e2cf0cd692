"""Run Claude Code headless against the gateway and report every status the gateway returned.

    .venv/bin/python scripts/claude_code_check.py                 # scripted upstream
    .venv/bin/python scripts/claude_code_check.py --route local   # the embedded engine (tiny)

Needs `claude` on PATH (`npm install -g @anthropic-ai/claude-code`) and Redis at --redis (the
gateway starts a private one when it is not reachable). Nothing leaves 127.0.0.1: Claude Code
runs with CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1, its own HOME, and the gateway as
ANTHROPIC_BASE_URL, asking for its own model ids (mapped by the gateway's `model_patterns`).

Scripted route: an OpenAI-compatible upstream on 127.0.0.1 answers the first turn with
reasoning and a Bash tool call (`echo <marker>`), and the turn after the tool result with text
quoting what the tool printed; every other request (title or topic requests) gets a short text.
Success: Claude Code ran the command, its final answer holds the marker (so the tool result made
the round trip), the second turn carried the signed thinking back, and no 4xx or 5xx.

Local route: the gateway's local engine on the "tiny" demo checkpoint, rewired (tests/e2e/
scripted_model.py) so that after `</think>` it writes a Bash tool call (`echo <LOCAL_MARKER>`) and
after a tool result "All done." (Claude Code gets `--system-prompt` and `--tools Bash`, since the
tiny model has a 2048-token context). Success: the same as above, without the thinking check.
`--random` keeps the random weights: the text is noise, Claude Code may stop at max_tokens, and
what must hold is the protocol: no 4xx or 5xx, a result event from Claude Code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.text.tokenizer import Tokenizer  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config.settings import Settings  # noqa: E402
from gateway.keys.records import KeyCreate  # noqa: E402
from gateway.keys.store import KeyStore  # noqa: E402
from testkit.scripted_model import (  # noqa: E402
    build_tiny_checkpoint,
    rewire_checkpoint,
    tool_call_text,
)

LOCAL_MARKER = "local-engine-ok"

REASONING = "The user wants a shell command run. I will call Bash."


def _free_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


class ScriptedUpstream:
    """An OpenAI chat-completions upstream whose answers follow the script above."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.turns: list[str] = []  # what each request was answered with
        self.reasoning_replayed = False
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        sock = _free_socket()
        await web.SockSite(self.runner, sock).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    def _plan(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages") or []
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        last = messages[-1] if messages else {}
        thinking = (body.get("thinking") or {}).get("type") == "enabled"
        reasoning = [{"reasoning_content": REASONING}] if thinking else []
        if last.get("role") == "tool":
            self.turns.append("answer after the tool result")
            self.reasoning_replayed |= any(
                m.get("role") == "assistant" and m.get("reasoning_content") == REASONING
                for m in messages
            )
            output = str(last.get("content") or "").strip()
            return [*reasoning, {"content": f"The command printed: {output}"}]
        if "Bash" in tools:
            self.turns.append("Bash tool call")
            arguments = json.dumps({"command": f"echo {self.marker}", "description": "Echo"})
            call = {"index": 0, "id": "call_script0", "type": "function"}
            return [
                *reasoning,
                {"tool_calls": [{**call, "function": {"name": "Bash", "arguments": ""}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": arguments[:20]}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": arguments[20:]}}]},
            ]
        self.turns.append("plain text (no Bash tool offered)")
        return [{"content": "ok"}]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        deltas = self._plan(body)
        finish = "tool_calls" if any("tool_calls" in d for d in deltas) else "stop"
        head = {"id": "chatcmpl-script", "object": "chat.completion.chunk", "model": "script"}
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for delta in [{"role": "assistant", "content": ""}, *deltas]:
            chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        last = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        await resp.write(f"data: {json.dumps(last)}\n\n".encode())
        tail = {**head, "choices": [], "usage": usage}
        await resp.write(f"data: {json.dumps(tail)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp


def local_checkpoint(data: Path, scripted: bool) -> Path:
    tiny = build_tiny_checkpoint(data / "tiny")
    if not scripted:
        return tiny
    tokenizer = Tokenizer.from_dir(tiny)
    special = tokenizer.special
    call = tool_call_text("Bash", json.dumps({"command": f"echo {LOCAL_MARKER}"}))
    chains = [
        [special.think_end, *tokenizer.encode(call), special.eos],
        [special.tool_output_end, *tokenizer.encode("All done."), special.eos],
    ]
    return rewire_checkpoint(tiny, data / "scripted", chains)


def gateway_settings(args: argparse.Namespace, upstream_url: str, data: Path) -> Settings:
    common: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0},
        "redis": {"url": args.redis, "key_prefix": args.prefix, "data_dir": data / "redis"},
        "logging": {"format": "console", "level": "warning"},
        "use_presets": False,
        "model_patterns": {"claude-*haiku*": "chat", "claude-*": "reasoner", "*": "chat"},
    }
    if args.route == "local":
        route = {"provider": "local", "model": "deepseek-v3.1"}
        return Settings(
            **common,
            engine={
                "model_path": local_checkpoint(data, scripted=not args.random),
                "dtype": "float32",
                "device": "cpu",
                "block_size": 16,
                "cache_memory_mb": 64,
                "max_batch_tokens": 2048,
                "num_threads": 1,
            },
            providers={"local": {"kind": "local"}},
            models={
                "chat": {"routes": [{**route, "thinking": False}]},
                # the scripted model writes its tool call after `</think>`: thinking off
                "reasoner": {"routes": [{**route, "thinking": args.random}]},
            },
        )
    provider = {"kind": "openai", "base_url": upstream_url, "send_reasoning_history": True}
    return Settings(
        **common,
        providers={"script": provider},
        models={
            "chat": {"routes": [{"provider": "script", "model": "script", "thinking": False}]},
            "reasoner": {"routes": [{"provider": "script", "model": "script", "thinking": True}]},
        },
    )


async def run_claude(args: argparse.Namespace, root: str, key: str, home: Path) -> dict[str, Any]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": root,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    env["ANTHROPIC_AUTH_TOKEN" if args.auth == "bearer" else "ANTHROPIC_API_KEY"] = key
    if args.route == "local":
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(args.max_output_tokens)
    command = [
        shutil.which("claude") or "claude",
        "-p",
        args.prompt,
        "--output-format",
        "stream-json",
        "--verbose",
        "--allowedTools",
        "Bash",
        "--max-turns",
        str(args.max_turns),
    ]
    if args.route == "local":  # the tiny model has a 2048-token context
        command += ["--system-prompt", "You are a terse assistant.", "--tools", "Bash"]
    proc = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        cwd=home,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=args.timeout_s)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
    lines = [json.loads(ln) for ln in out.decode().splitlines() if ln.strip().startswith("{")]
    tools_run = [
        block.get("content")
        for line in lines
        if line.get("type") == "user"
        for block in (line.get("message") or {}).get("content") or []
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    result = next((ln for ln in lines if ln.get("type") == "result"), {})
    return {
        "exit_code": proc.returncode,
        "result": result.get("result"),
        "is_error": result.get("is_error"),
        "num_turns": result.get("num_turns"),
        "tool_results": tools_run,
        "stderr_tail": err.decode()[-500:],
    }


async def main(args: argparse.Namespace) -> int:
    marker = f"gateway-check-{uuid.uuid4().hex[:8]}"
    shown = marker if args.route == "script" else LOCAL_MARKER
    args.prompt = args.prompt or f"Run the shell command `echo {shown}` and tell me its output."
    upstream = ScriptedUpstream(marker)
    statuses: list[tuple[str, str, int]] = []

    async def record(request: web.Request, response: web.StreamResponse) -> None:
        statuses.append((request.method, request.path_qs, response.status))

    with tempfile.TemporaryDirectory(prefix="claude-check-") as tmp:
        data = Path(tmp)
        upstream_url = await upstream.start()
        app = create_app(gateway_settings(args, upstream_url, data))
        app.on_response_prepare.append(record)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = _free_socket()
        await web.SockSite(runner, sock).start()
        root = f"http://127.0.0.1:{sock.getsockname()[1]}"
        redis = Redis.from_url(args.redis)
        try:
            secret, _ = await KeyStore(redis, prefix=args.prefix).create(KeyCreate(name="claude"))
            started = time.perf_counter()
            home = data / "home"
            home.mkdir()
            outcome = await run_claude(args, root, secret, home)
            elapsed = time.perf_counter() - started
        finally:
            await runner.cleanup()
            await upstream.stop()
            keys = [k async for k in redis.scan_iter(match=f"{args.prefix}*", count=1000)]
            if keys:
                await redis.delete(*keys)
            await redis.aclose()

    print(f"route: {args.route}   auth: {args.auth}   claude exit code: {outcome['exit_code']}")
    print(f"claude ran for {elapsed:.1f} s, {outcome['num_turns']} turns")
    print("gateway responses:")
    for method, path, status in statuses:
        print(f"  {status}  {method} {path}")
    if args.route == "script":
        print("upstream turns:", "; ".join(upstream.turns))
        print("signed thinking replayed to the upstream:", upstream.reasoning_replayed)
    print("tool results seen by Claude Code:", json.dumps(outcome["tool_results"])[:300])
    print("final result:", json.dumps(outcome["result"])[:300])
    failures = [s for _, _, s in statuses if s >= 400]
    ok = not failures and bool(statuses) and outcome["exit_code"] == 0 and outcome["result"]
    if args.route == "script":
        ok = ok and marker in str(outcome["result"]) and upstream.reasoning_replayed
    elif args.random:  # noise may run into max_tokens: Claude Code then reports an error
        ok = not failures and bool(statuses) and outcome["result"] is not None
    else:
        ok = ok and LOCAL_MARKER in json.dumps(outcome["tool_results"])
    if not ok:
        print("stderr:", outcome["stderr_tail"])
    print("PASS" if ok else f"FAIL ({len(failures)} error statuses)")
    return 0 if ok else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--route", choices=("script", "local"), default="script")
    parser.add_argument("--auth", choices=("bearer", "x-api-key"), default="bearer")
    parser.add_argument("--random", action="store_true", help="local: random weights")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--prefix", default=f"claude-check:{uuid.uuid4().hex}:")
    parser.add_argument("--prompt", default="")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-output-tokens", type=int, default=48)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
