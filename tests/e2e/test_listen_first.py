"""Listen first: the gateway serves while its local engine is still being built or loaded.

The demo checkpoint's lock is held by "another process" that has trained 45% of it: the gateway
starts, /healthz answers at once, /readyz is 503 and says what is loading and how far, the
local routes answer 503 `engine_loading` with Retry-After in each API's own error shape, the
upstream routes serve, and a model with a local and an upstream route falls back to the
upstream. Once the lock is let go, the gateway builds the demo itself and turns ready. An
engine that cannot be loaded stops the process, after it has listened.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from plumbing.file_lock import FileLock
from testkit.gateway_app import REDIS_URL, closed_port, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream
from tests.support.faults import USER, eventually

ENGINE = {
    "demo_preset": "tiny",
    "demo_weights": "random",
    "dtype": "float32",
    "block_size": 16,
    "cache_memory_mb": 2,
    "max_num_seqs": 8,
    "max_batch_tokens": 512,
    "num_threads": 1,
}
LOCAL = {"provider": "local", "model": "deepseek-v3.1", "thinking": False}
MODELS = {
    "local-model": {"routes": [LOCAL]},
    "echo-model": {"routes": [{"provider": "mock", "model": "echo"}]},
    "mixed-model": {"routes": [LOCAL, {"provider": "mock", "model": "echo"}]},
}


async def _post(
    session: aiohttp.ClientSession, root: str, path: str, model: str
) -> tuple[int, Any, dict[str, Any]]:
    body = {"model": model, "messages": USER, "max_tokens": 4}
    headers = {"anthropic-version": "2023-06-01"}
    async with session.post(f"{root}{path}", json=body, headers=headers) as resp:
        return resp.status, resp.headers, await resp.json()


async def _ready(session: aiohttp.ClientSession, root: str) -> tuple[int, dict[str, Any]]:
    async with session.get(f"{root}/readyz") as resp:
        return resp.status, await resp.json()


async def test_the_gateway_serves_while_its_engine_loads(
    mock_upstream: MockUpstream, redis_prefix: str, tmp_path: Path
) -> None:
    base = gateway_settings(mock_upstream, redis_prefix)
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        auth={"enabled": False},
        engine={**ENGINE, "demo_dir": tmp_path},
        providers={
            "mock": base.providers["mock"].model_dump(exclude_unset=True),
            "local": {"kind": "local"},
        },
        models=MODELS,
    )
    lock = FileLock(tmp_path / ".tiny.lock").acquire()
    lock.note("4242 45%")  # another process, 45% through training the demo
    runner, root = await start_gateway(settings, wait_loaded=False)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{root}/healthz") as resp:
                assert resp.status == 200

            async def reports_progress() -> bool:
                _, body = await _ready(s, root)
                return body["loading"] == {"engine:local": "training demo 45% in process 4242"}

            await eventually(reports_progress, within_s=60)
            status, body = await _ready(s, root)
            assert status == 503 and body["status"] == "not_ready"
            assert body["checks"] == {"redis": True, "engine:local": False, "accepting": True}
            async with s.get(f"{root}/metrics") as resp:
                assert 'gateway_engine_loading{provider="local"} 1.0' in await resp.text()

            status, headers, answer = await _post(s, root, "/v1/chat/completions", "local-model")
            assert status == 503 and int(headers["Retry-After"]) >= 1
            assert answer["error"]["code"] == "engine_loading"
            assert "training demo 45%" in answer["error"]["message"]
            status, headers, answer = await _post(s, root, "/v1/messages", "local-model")
            assert status == 529 and int(headers["Retry-After"]) >= 1  # Anthropic's overloaded
            assert answer["type"] == "error" and answer["error"]["type"] == "overloaded_error"
            assert "not ready yet" in answer["error"]["message"]

            status, _, answer = await _post(s, root, "/v1/chat/completions", "echo-model")
            assert status == 200 and answer["choices"][0]["message"]["content"]
            status, headers, answer = await _post(s, root, "/v1/chat/completions", "mixed-model")
            assert status == 200 and "provider=mock" in headers["x-gateway-route"]
            status, _, answer = await _post(s, root, "/v1/messages", "echo-model")
            assert status == 200 and answer["type"] == "message"

            lock.release()  # the other process is gone: this one builds the demo

            async def ready() -> bool:
                return (await _ready(s, root))[0] == 200

            await eventually(ready, within_s=300)
            status, body = await _ready(s, root)
            assert body["loading"] == {} and body["checks"]["engine:local"] is True
            status, _, answer = await _post(s, root, "/v1/chat/completions", "local-model")
            assert status == 200 and answer["usage"]["completion_tokens"] >= 1
    finally:
        lock.release()
        await runner.cleanup()


async def test_an_engine_that_fails_to_load_stops_the_process(
    tmp_path: Path, redis_prefix: str
) -> None:
    """A checkpoint that passes the start's quick check (its config.json exists) but cannot be
    loaded: the process listens, logs why and exits with a failure."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    port = closed_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"""
[server]
host = "127.0.0.1"
port = {port}
[redis]
url = "{REDIS_URL}"
embedded = false
key_prefix = "{redis_prefix}"
[logging]
format = "json"
[auth]
enabled = false
[engine]
model_path = "{broken}"
[providers.local]
kind = "local"
[models."local-model"]
routes = [{{ provider = "local", model = "deepseek-v3.1" }}]
"""
    )
    env = {**os.environ, "GATEWAY_USE_PRESETS": "false", "HF_HUB_OFFLINE": "1"}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 1
    lines = done.stderr.decode().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    names = [e["event"] for e in events]
    assert "listening" in names and "engine_load_failed" in names
    failed = events[names.index("engine_load_failed")]
    assert failed["level"] == "error" and "tokenizer" in failed["error"]
    assert "stopped: a local engine failed to load" in lines[-1]
